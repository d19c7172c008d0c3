"""Test-session fixtures live in tests/fixtures/, one module per real component.

They start real things (a tansu broker, Spark with the Iceberg runtime, PyFlink jobs) once
per test session where they can, because each costs seconds to start on a 2-core machine.

Under CI (`CI=true`) a skipped test fails the run: every component a test needs (PostgreSQL,
a mountable tmpfs, ...) is installed by `make setup` there, so a skip means a missing install
step, not an optional feature. `EXPECTED_SKIPS` lists the test ids allowed to skip anyway
(none today).
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.spark",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
    "tests.fixtures.mock_kafka",
    "tests.fixtures.registry",
    "tests.fixtures.rest_catalog",
    "tests.fixtures.seaweed",
    "tests.runbooks.drill",  # the `drills` fixture of the runbook drills (tests/runbooks, tests/cdc)
]

EXPECTED_SKIPS: frozenset[str] = frozenset()

# No `streamberg run` or `govern` a test starts serves its dashboard on the default port unless
# the test asks (`--dashboard ADDRESS:PORT`): two workers run such tests at once, and a fixed
# port taken by the other worker's made one exit (a clean clone's run, 2026-12-06 16:35). The
# dashboard's own tests serve it on a free port.
os.environ.setdefault("STREAMBERG_DASHBOARD", "off")

# The tiers, set at collection from what a test uses (its fixtures, and the source of the test
# and of its fixtures), so no test can forget its marker:
#   spark  a Spark session (the `spark` fixture)        broker  a Kafka-protocol broker
#   flink  a PyFlink job (`streamberg ingest`/`run`, run_ingest, a Flink cluster)
#   chaos  kill -9 and drills, local clusters: the slowest, least parallel tests
#   slow   (by hand, `@pytest.mark.slow`) a test measured past ~10 s alone on 2 cores
# `make test-fast` runs `-m "not flink and not chaos and not slow"`; `make test` runs everything.
_FLINK_WORDS = ('"ingest", "--config"', "run_ingest(", "run_fleet_ingest(", '"run", "--config"', "flink_submit")
_CHAOS_WORDS = ("SIGKILL", "kill -9", "killpg", "local-cluster.sh", "test_drills")


def _sources(item: pytest.Item) -> str:
    import inspect

    parts = []
    for obj in [getattr(item, "function", None),
                *(d.func for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values()
                  for d in defs)]:
        try:
            parts.append(inspect.getsource(obj))
        except (OSError, TypeError):
            continue
    return "\n".join(parts)


def tiers_of(item: pytest.Item) -> set[str]:
    names = set(getattr(item, "fixturenames", ()))
    source = _sources(item)
    found = {m.name for m in item.iter_markers() if m.name in ("spark", "flink", "broker", "chaos")}
    if "spark" in names:
        found.add("spark")
    if "broker" in names or "mock_kafka" in names:
        found.add("broker")
    if any(word in source for word in _FLINK_WORDS):
        found.add("flink")
    if any(word in source for word in _CHAOS_WORDS) or "runbooks/test_drills.py" in item.nodeid \
            or "deploy/test_local_clusters.py" in item.nodeid:
        found.add("chaos")
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tiers_of(item) - {m.name for m in item.iter_markers()}:
            item.add_marker(getattr(pytest.mark, tier))

_unexpected_skips: list[str] = []


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# Descriptors the pytest process holds, and which test module's tests left them open: a leak
# here once pushed a pipe past select()'s 1024 limit late in a full run (stop 48).
_fd_growth: dict[str, int] = {}


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


FD_COLLECT_ABOVE = 256


@pytest.fixture(scope="module", autouse=True)
def _close_catalogs_after_module():
    """Each module's catalogs closed when it ends (set up first, so torn down after the module's
    own fixtures): the process-wide catalog caches hold every test's SQLite files, and a
    SQLAlchemy engine let go sits in reference cycles, its connections open until a full
    collection, which a large heap seldom runs."""
    yield
    from streamberg.common.catalog import close_shared_catalogs

    close_shared_catalogs()
    if _open_fds() > FD_COLLECT_ABOVE:  # a full collection of this heap costs ~0.3 s: only when it pays
        gc.collect()


# Each test's teardown report carries the descriptors its process holds then, and which
# process it is (a pytest-xdist worker under `make test`, or the one process): the report is
# read where it arrives (the workers' controller, or the process itself), so the growth is
# counted per process and module wherever the tests ran.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "teardown":
        report.user_properties.append(("open_fds", _open_fds()))
        report.user_properties.append(("fds_of", os.environ.get("PYTEST_XDIST_WORKER", "pytest")))
    return report


_fd_last_of: dict[str, int] = {}  # process -> its descriptors at its last teardown


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    found = dict(report.user_properties) if report.when == "teardown" else {}
    if "open_fds" in found:
        now, process = int(found["open_fds"]), str(found.get("fds_of", "pytest"))
        last = _fd_last_of.get(process)
        if last:
            module = report.nodeid.split("::")[0]
            _fd_growth[module] = _fd_growth.get(module, 0) + now - last
        _fd_last_of[process] = now
    if report.skipped and report.nodeid not in EXPECTED_SKIPS and not hasattr(report, "wasxfail"):
        _unexpected_skips.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _under_ci() and _unexpected_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    leaks = sorted(((n, m) for m, n in _fd_growth.items() if n > 0), reverse=True)[:10]
    if leaks:
        held = ", ".join(f"{p} {n}" for p, n in sorted(_fd_last_of.items()))
        terminalreporter.section(f"descriptors left open in the pytest processes (open at their last test: {held})")
        for grown, module in leaks:
            terminalreporter.line(f"{grown:6d}  {module}")
    if _under_ci() and _unexpected_skips:
        terminalreporter.section("unexpected skips under CI (they fail the run)", red=True)
        for nodeid in _unexpected_skips:
            terminalreporter.line(nodeid)
