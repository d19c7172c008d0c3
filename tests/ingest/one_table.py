"""The real ingest Writer of a config of one table (a config of one route, as the job runs
it: common/config/loading.as_fleet), with its one lane at hand: for tests that look at one
table's positions, skips and units."""

from __future__ import annotations

from streamberg.common.config import StreambergConfig
from streamberg.common.config.loading import as_fleet
from streamberg.ingest.lane import TableLane
from streamberg.ingest.units import FlushUnit
from streamberg.ingest.writer import Writer


class OneTableWriter:
    def __init__(self, config: StreambergConfig, index: int, parallelism: int, run_id: str) -> None:
        self.writer = Writer(as_fleet(config), index, parallelism, run_id)
        self.table = config.table.identifier

    def open(self) -> None:
        self.writer.open()

    @property
    def lane(self) -> TableLane:
        return self.writer.lanes[self.table]

    @property
    def position(self) -> dict[int, int]:
        return self.lane.position

    @property
    def skips(self) -> dict:
        return self.lane.skips

    @property
    def consumer(self):
        assert self.writer.source is not None
        return self.writer.source.consumer

    def poll(self) -> FlushUnit | None:
        """One batch; the table's unit when its interval ended."""
        units = [u for u in self.writer.poll() if u.refused is None]
        return units[0] if units else None

    def finish(self) -> FlushUnit:
        return self.writer.finish()[0]

    def reposition(self) -> None:
        self.writer.reassign()

    def close(self) -> None:
        self.writer.close()
