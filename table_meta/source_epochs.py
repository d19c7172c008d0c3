"""Source epochs: when a change-data source's positions start over, later changes still win.

The merge orders a key's changes by their source position (docs/cdc.md#order). Positions go
backwards when the source starts over: MySQL after RESET MASTER (binlog files from 000001
again) or a failover to another server (`db2-bin.000007` after `mysql-bin.000412`), a
PostgreSQL restored into a new cluster (LSNs from where the backup stood), a connector that
knows only `ts_ms` behind a clock set back. Compared as they are, every later change would be
older than what the table holds, and dropped as stale.

An *epoch* is the most significant part of a change's sequence: a change of epoch 1 is newer
than any of epoch 0, whatever its position. Epochs open two ways, both recorded in the change
log's table property `streamberg.source-epochs` (JSON, written by the merge and by
`streamberg merge --new-source-epoch`):

- **by the source's name** (`_source_id`, where the connector says it: MySQL's server id and
  binlog base name, decode/envelopes/source_position.py): the first name seen is epoch
  0; the merge gives each new name the next epoch, by itself;
- **declared by an operator** from a Kafka position on (`since`: partition -> first offset of
  the new epoch; a partition not named is in it whole): RESET MASTER, a PostgreSQL restore, a
  clock set back keep the source's name, so only an operator can say they started over.

A change's epoch is the greater of the two. Epoch 0 leaves the sequence as it is (sequences
stored before epochs existed compare as before); epoch e > 0 puts `~` and e (ordered text)
before it: `~` sorts after every digit, so it is newer than every epoch-0 sequence.

A position that goes backwards in one partition, at a later offset, with no epoch to explain
it, is a *regression*: the merge applies everything else, records it in the change log's
property `streamberg.source-regression` (how many, from which offsets, and the change-log
snapshot before them), and status turns critical with the runbook
(docs/runbooks/cdc-source-regressed.md). Declaring the epoch then makes the next merge read
the change log again from before the regression (`streamberg.merge.reapply-after`): changes
merged already are equal to what the key state holds and are not applied twice; the
regressed ones, now newer, are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from streamberg.table_meta.changelog import encode_sequence

EPOCHS_PROPERTY = "streamberg.source-epochs"
REGRESSION_PROPERTY = "streamberg.source-regression"
REAPPLY_PROPERTY = "streamberg.merge.reapply-after"
EPOCH_MARK = "~"  # after every digit: an epoch > 0 sequence is newer than any epoch-0 one
MAX_EPOCHS = 1000


class Epoch(BaseModel):
    epoch: int = Field(ge=1)
    since: dict[int, int] = Field(default_factory=dict)  # partition -> first offset in it (declared)
    source: str | None = None  # the source name that opened it (automatic)
    why: str = ""
    at: str = ""

    model_config = {"extra": "ignore"}


class Epochs(BaseModel):
    """What the change log records: the epochs opened, and each source name's epoch."""

    epochs: list[Epoch] = Field(default_factory=list, max_length=MAX_EPOCHS)
    sources: dict[str, int] = Field(default_factory=dict)

    model_config = {"extra": "ignore"}

    @property
    def latest(self) -> int:
        return max([0, *self.sources.values(), *(e.epoch for e in self.epochs)])

    def with_sources(self, seen: list[str], first_offsets: Mapping[str, Mapping[int, int]], now: str) -> Epochs:
        """New source names get the next epochs (in order of their first offset); the very
        first name ever seen is epoch 0's."""
        out = self.model_copy(deep=True)
        fresh = sorted((s for s in seen if s not in out.sources),
                       key=lambda s: (min(first_offsets.get(s, {}).values(), default=0), s))
        for name in fresh:
            if not out.sources and not out.epochs:
                out.sources[name] = 0
                continue
            number = out.latest + 1
            out.sources[name] = number
            out.epochs.append(Epoch(epoch=number, since=dict(first_offsets.get(name, {})), source=name,
                                    why=f"positions of a new source {name}", at=now))
        return out

    def declared(self, since: Mapping[int, int], why: str, now: str) -> Epochs:
        out = self.model_copy(deep=True)
        out.epochs.append(Epoch(epoch=out.latest + 1, since=dict(since), why=why, at=now))
        return out

    def prefixes(self) -> dict[int, str]:
        """epoch -> the text put before its sequences."""
        numbers = {*self.sources.values(), *(e.epoch for e in self.epochs)}
        return {n: EPOCH_MARK + str(encode_sequence(n)) for n in sorted(numbers) if n > 0}

    def to_property(self) -> str:
        return self.model_dump_json()


class Regression(BaseModel):
    """Positions that went backwards with no epoch to explain them, not yet resolved."""

    changes: int = 0
    since: dict[int, int] = Field(default_factory=dict)  # partition -> first offset that went back
    after_snapshot: int | None = None  # the change-log snapshot applied before them (re-read from here)
    first_seen: str = ""
    last_seen: str = ""

    model_config = {"extra": "ignore"}

    def joined(self, changes: int, since: Mapping[int, int], after_snapshot: int | None, now: str) -> Regression:
        merged = dict(self.since)
        for p, o in since.items():
            merged[p] = min(merged.get(p, o), o)
        earliest = self.after_snapshot if self.changes else after_snapshot
        return Regression(changes=self.changes + changes, since=merged, after_snapshot=earliest,
                          first_seen=self.first_seen or now, last_seen=now)


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_epochs(properties: Mapping[str, str]) -> tuple[Epochs, str | None]:
    """The change log's epochs (none recorded: no epoch but 0) and, when the property cannot
    be read, why (the merge then refuses to guess: status names it)."""
    text = properties.get(EPOCHS_PROPERTY)
    if not text:
        return Epochs(), None
    try:
        return Epochs.model_validate(json.loads(text)), None
    except (ValueError, ValidationError) as exc:
        return Epochs(), f"{EPOCHS_PROPERTY} cannot be read ({str(exc).splitlines()[0][:200]})"


def read_regression(properties: Mapping[str, str]) -> Regression | None:
    text = properties.get(REGRESSION_PROPERTY)
    if not text:
        return None
    try:
        return Regression.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        return Regression(changes=1, first_seen="unreadable record")


def reapply_after(properties: Mapping[str, str]) -> int | None:
    text = properties.get(REAPPLY_PROPERTY)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def update_changelog_properties(catalog: Any, identifier: str, updates: Mapping[str, str],
                                removals: tuple[str, ...] = (), retries: int = 10) -> None:
    """Set (and remove) change-log properties beside the ingest's appends: a commit that lost
    the race to an append is tried again on the table as it now is."""
    from pyiceberg.exceptions import CommitFailedException

    from streamberg.common.retry import commit_retrying, is_instance

    for attempt in commit_retrying(retries, is_instance(CommitFailedException)):
        with attempt:
            table = catalog.load_table(identifier)
            gone = [k for k in removals if k in table.properties]
            if not updates and not gone:
                return
            with table.transaction() as tx:
                if updates:
                    tx.set_properties(dict(updates))
                if gone:
                    tx.remove_properties(*gone)
