"""The record of each optimize, written into the snapshot summary of its commit.

Keys (all strings, prefix ``streamberg.compactor.``, declared in table_meta/summary_keys.py):

======================  ===========================================================
run-id                  one compactor process run
commit-id               this commit (also used to recognise it after an unknown state)
mode                    incremental | full
strategy, columns       the layout and its clustering columns (comma separated)
groups                  file groups in this commit; commit = "k/n" of the plan
files-in, files-out     data files replaced / written
bytes-in, bytes-out     their total sizes
records                 rows rewritten
duration-ms             time spent rewriting the groups of this commit
plan-snapshot-id        the snapshot the plan started from (commits are validated against it)
covered-snapshots       ingest snapshot ids whose files were rewritten (oldest first)
batch-id                the streaming micro-batch that triggered it (absent for --full)
======================  ===========================================================

Compactor commits never carry the ingest keys (``streamberg.kafka-offsets.*``,
``streamberg.job-id``): ingest finds its Kafka position by walking back to the nearest
snapshot that has them, so a compactor snapshot must never look like one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streamberg.common.errors import ForbiddenSummaryKey
from streamberg.table_meta.summary_keys import is_ingest_key

# A summary value is a string in the table metadata; keep it bounded.
MAX_COVERED_LISTED = 500


def check_summary(summary: Mapping[str, str]) -> dict[str, str]:
    """The summary as a plain dict, refusing any key ingest relies on."""
    bad = sorted(k for k in summary if is_ingest_key(k))
    if bad:
        raise ForbiddenSummaryKey(f"compactor commits must not carry ingest keys: {bad}")
    return {str(k): str(v) for k, v in summary.items()}


def covered_value(snapshot_ids: Iterable[int]) -> str:
    ids = list(dict.fromkeys(snapshot_ids))
    if len(ids) > MAX_COVERED_LISTED:
        head = ids[: MAX_COVERED_LISTED // 2]
        tail = ids[-MAX_COVERED_LISTED // 2 :]
        return ",".join(map(str, head)) + f",...({len(ids) - len(head) - len(tail)} more)...," + ",".join(map(str, tail))
    return ",".join(map(str, ids))
