"""A run's folder (`<ingest.state_dir>/runs/<run id>`): how the driver and the workers of one
local run talk without a channel of their own. Every marker file is named here.

- `stop`: the driver asks the writers to flush and finish (ingest/read_progress.py writes it);
- `drained`: the committer committed every writer's last unit after a stop;
- `fenced`: the committer found another instance's commit (its message inside);
- `lost-offsets`: a writer refused to read on past a lost Kafka position
  (`ingest.on_lost_offsets: fail`, the reason inside).

On a cluster the driver and the workers do not share a disk; stop the job through Flink.
"""

from __future__ import annotations

from pathlib import Path

from streamberg.common.config import StreambergConfig

STOP_MARKER = "stop"
DRAINED_MARKER = "drained"
FENCED_MARKER = "fenced"
LOST_OFFSETS_MARKER = "lost-offsets"


def run_dir(config: StreambergConfig, run_id: str) -> Path:
    return Path(config.ingest.state_dir) / "runs" / run_id
