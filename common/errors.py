"""Every error streamberg raises on purpose, in one tree (as pyiceberg's `exceptions.py`).

All derive from `StreambergError`: the CLI prints any of them as one line, without a
traceback, and exits with the error's `exit_code` (1; `ConfigError` 2; `IngestFenced` 3:
common/exit_codes.py). Library code raises these; only the CLI ends processes. Errors that also are a `ValueError` keep that base for callers that
already catch ValueError for bad input.

Errors that cross a process boundary as text (a Python worker's failure reaches the Flink
driver as a Java exception's message) are recognised by class name in `named_in`, never by
ad-hoc message matching.
"""

from __future__ import annotations

from streamberg.common.exit_codes import ExitCode


class StreambergError(Exception):
    """Base class of every error streamberg raises on purpose; `exit_code` is the process's
    exit code when it ends a command (common/exit_codes.py)."""

    exit_code: ExitCode = ExitCode.FAILED


# -- configuration and set-up ----------------------------------------------------------------
class ConfigError(StreambergError, ValueError):
    """Raised when the configuration cannot be used; the message names every offending key
    (in one line), `problems` lists them one by one (`streamberg check` prints them all)."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class MissingJarError(StreambergError):
    """Raised when a JVM dependency is not installed; the message says how to get it."""


class SparkCatalogError(StreambergError):
    """Raised when the Spark side cannot be set up for this catalog (unsupported URI, a
    clashing catalog in a shared session)."""


# -- catalog and tables -----------------------------------------------------------------------
class CatalogUnreachable(StreambergError):
    """Raised when the catalog database cannot be read; the message says which and why
    (password removed)."""


class SideTableTaken(StreambergError):
    """Raised when a table the product writes beside a table (its dead letters, change log,
    merge keys) exists and is not that: another topic's data table, or a table of another
    shape. The one table it serves is refused (paused, in a config of many); nothing is
    written into a table that is not what it should be."""


class SchemaMismatchError(StreambergError):
    """Raised when the existing table cannot take the records the config describes."""


class IgnoredFieldsRefused(SchemaMismatchError):
    """A table's streamberg.ingest.ignored-fields names a column the table still has: a bad
    property value of that table (never written by the governor, which drops the column in
    the same commit); its ingest is refused, the others go on."""


class UnsupportedSchemaError(StreambergError, ValueError):
    """Raised when the table has a column type the JSON ingest cannot fill."""


class ForbiddenSummaryKey(StreambergError, ValueError):
    """Raised when a non-ingest commit would carry a key only ingest commits may carry."""


# -- Kafka --------------------------------------------------------------------------------------
class BrokerError(StreambergError):
    """Raised when the embedded broker cannot be started, stopped or asked, or a topic made."""


class BrokerUnreachable(StreambergError):
    """Raised when the broker did not answer within the timeout; the message says what failed."""


class RegistryUnavailable(StreambergError):
    """Raised when the schema registry did not give a writer schema after its retries (down,
    refusing the credentials, or not knowing the schema id): the records stay in Kafka."""


class SchemaNotFound(StreambergError):
    """The registry answered, after its retries, that it has no such schema (HTTP 404), and
    kafka.schema_registry.on_unknown_schema is dead-letter: the records naming it are dead
    letters with the id in their reason."""


# -- ingest -------------------------------------------------------------------------------------
class FencedError(StreambergError):
    """Raised when another committer moved the table's offsets: committing now would duplicate."""


class OffsetChainError(StreambergError):
    """Raised when flushed units do not continue the committed offsets (a gap or an overlap)."""


class LostOffsetsError(StreambergError):
    """Raised when a position the table recorded is no longer on the broker (records deleted
    before they were ingested, or the partition's offsets went back) and
    `ingest.on_lost_offsets` is `fail`; the message names the partition, the committed offset
    and the watermarks."""


class CommitRetriesExhausted(StreambergError):
    """Raised when a commit kept losing races past its configured retries."""


class JobFailed(StreambergError):
    """Raised when the ingest job failed for good (Flink gave up restarting, or it was cancelled)."""


class IngestFenced(JobFailed):
    """Raised when another ingest instance commits to this table; the run stopped without restart."""

    exit_code = ExitCode.FENCED  # the supervisor keys on it: a restart cannot help

    def __init__(self, message: str, outcome: object = None):
        super().__init__(message)
        self.outcome = outcome  # the run's RunOutcome: what it committed itself


class ReplayRefused(StreambergError):
    """Raised when a replay would duplicate or move what the ingest owns; nothing was written."""


class FreshReadRefused(StreambergError):
    """Raised when a fresh read (fresh/) cannot be exact: the tail's records are gone, of
    another log, or not yet placed by the ingest; or the table is of a kind it does not read."""


# -- compactor ----------------------------------------------------------------------------------
class LayoutError(StreambergError, ValueError):
    """Raised when a layout cannot be applied (unknown strategy, missing or unorderable column)."""


class GroupRewriteError(StreambergError):
    """Raised when a file group could not be rewritten (its files are left as they are)."""


class StreamFailed(StreambergError):
    """Raised when the compactor's streaming query stopped with an error."""


class LeaseHeldError(StreambergError):
    """Raised when another compactor holds the table's lease."""


class LeaseLostError(StreambergError):
    """Raised when this compactor no longer holds the lease it had."""


class CompactError(StreambergError):
    """Raised for an operator-facing compactor failure (missing table, failed stream)."""


class MergeError(StreambergError):
    """Raised for an operator-facing merge failure (no change log, a failed merge)."""


class MergeRefused(MergeError):
    """Raised when the merge cannot order the change log safely (its source-epoch record
    cannot be read): nothing is applied until an operator fixes it."""


class ResyncRefused(MergeError):
    """`streamberg merge --resynced-since` refused: deleting now could remove rows the source has."""


# -- maintenance --------------------------------------------------------------------------------
class LocationRefused(StreambergError):
    """Raised when a maintenance step would delete outside the table's location: orphan removal
    on a location outside the warehouse or holding another table, or an expiry whose expired
    snapshots alone reference files outside the location."""


class RetentionColumnError(StreambergError, ValueError):
    """Raised when maintenance.retention.column does not name a usable column of the table."""


class MaintainError(StreambergError):
    """Raised for an operator-facing maintenance failure (missing table, a failed --once step)."""


def _all_classes() -> list[type[StreambergError]]:
    found, todo = [], [StreambergError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def named_in(text: str) -> tuple[type[StreambergError], str] | None:
    """The streamberg error a remote traceback's text ends with, and its message.

    A Python worker's exception reaches the Flink driver only as text (`...FencedError: msg`);
    the last such line names the error that stopped the worker.
    """
    names = {cls.__name__: cls for cls in _all_classes() if cls is not StreambergError}
    found = None
    for line in text.splitlines():
        head, sep, message = line.strip().partition(": ")
        name = head.rsplit(".", 1)[-1]
        if sep and name in names:
            found = (names[name], message.strip())
    return found
