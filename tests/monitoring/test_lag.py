"""Lag as the ingest will read it (monitoring/lag.py, pure)."""

from __future__ import annotations

from streamberg.common.watermarks import Watermarks
from streamberg.monitoring.lag import compute_lag


def test_a_partition_added_to_an_ingested_topic_is_all_lag_even_with_latest() -> None:
    marks = Watermarks(exists=True, partitions={0: (0, 10), 1: (2, 7)})
    # The topic's first start with latest: nothing before it is lag.
    assert compute_lag({}, marks, "latest").total == 0
    # The table ingests the topic already: partition 1 is new and will be read from its start.
    lag = compute_lag({0: 10}, marks, "latest")
    assert lag.partitions["0"].lag == 0 and lag.partitions["1"].lag == 5 and lag.total == 5
    assert compute_lag({0: 4}, marks, "earliest").total == 6 + 5
