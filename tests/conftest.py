"""Test-session fixtures live in tests/fixtures/, one module per real component.

They start real things (a tansu broker, Spark with the Iceberg runtime, PyFlink jobs) once
per test session where they can, because each costs seconds to start on a 2-core machine.

Under CI (`CI=true`) a skipped test fails the run: every component a test needs (PostgreSQL,
a mountable tmpfs, ...) is installed by `make setup` there, so a skip means a missing install
step, not an optional feature. `EXPECTED_SKIPS` lists the test ids allowed to skip anyway
(none today).
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.spark",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
    "tests.fixtures.mock_kafka",
    "tests.fixtures.registry",
    "tests.fixtures.rest_catalog",
    "tests.runbooks.drill",  # the `drills` fixture of the runbook drills (tests/runbooks, tests/cdc)
]

EXPECTED_SKIPS: frozenset[str] = frozenset()

_unexpected_skips: list[str] = []


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and report.nodeid not in EXPECTED_SKIPS and not hasattr(report, "wasxfail"):
        _unexpected_skips.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _under_ci() and _unexpected_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if _under_ci() and _unexpected_skips:
        terminalreporter.section("unexpected skips under CI (they fail the run)", red=True)
        for nodeid in _unexpected_skips:
            terminalreporter.line(nodeid)
