"""One table with real ingest commits for the monitoring tests that only read it."""

from __future__ import annotations

import pytest

from tests.monitoring.helpers import Scenario, build_scenario

# Messages produced per partition, and two ingest commits behind them: the first by two
# writers (partition 0 with two dead letters, partition 1), the second on partition 0 only.
PRODUCED = {0: 150, 1: 80}
COMMITS = [
    [(0, 0, 100, (5, 17)), (1, 0, 60, ())],
    [(0, 100, 130, ())],
]


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory, broker: str) -> Scenario:
    """Read-only for tests: a table 130/60 offsets in, behind 150/80 produced messages."""
    return build_scenario(tmp_path_factory.mktemp("monitored"), broker, PRODUCED, COMMITS)
