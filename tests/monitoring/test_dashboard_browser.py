"""The dashboard as a person uses it: headless Chromium (Debian's, through its chromium-driver,
driven by Selenium) against a real governor keeping real tables: one fed by the real ingest
from the broker, three of an opted-in namespace written as Parquet commits; a real round of
the governor on the shared Spark session; the dashboard's model refreshed in the background.

Checked: the numbers shown equal `streamberg status --json` for the same table; a bad policy
value, and a table's broker stopped, show their reason and runbook link within one refresh;
the table's page lists the dead letters the dead-letter table holds; sorting and filtering; every
page loads with no failed request and no console error; screenshots kept as artifacts
(STREAMBERG_TEST_ARTIFACTS, default .streamberg/test-artifacts). And off loopback: refused
without a token, 401 without it on the wire, 200 with it."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import load_catalog
from streamberg.table_meta.declared import ensure_table
from tests.helpers import config_at, wait_for, write_config

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                   reason="Debian's chromium and chromium-driver are not installed (scripts/setup.sh)")
ARTIFACTS = Path(os.environ.get("STREAMBERG_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".streamberg"
                                / "test-artifacts"))
LAKE = ("lake.t01", "lake.t02", "lake.t03")


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1500,1100", "--disable-extensions"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def _severe(driver) -> list[str]:
    """Console errors and failed loads of the page (Chromium logs both as SEVERE)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


@pytest.fixture
def kept(tmp_path: Path, broker: str, spark):
    """A real governor keeping db.events (fed by the ingest) and three opted-in lake tables,
    one real round run, its dashboard served on loopback and refreshed every second."""
    from streamberg.cli import dashboard
    from streamberg.cli.govern import executors
    from streamberg.governor.service import build_service
    from streamberg.governor.tables import GovernedTables
    from streamberg.ingest.dead_letters import open_tables
    from tests.compactor.helpers import FakeIngest
    from tests.runbooks.inprocess import event, ingest_until, produce_values

    # The commit-age rule left out of the verdict (`commit_age_warn_intervals` far off): the 25
    # records wait while the test runs, and the page (refreshed a second ago) and `status`
    # (asked a moment later) would judge an age that crossed 3 commit intervals between them
    # (a loaded CI run did: 'ok' on the page, 'warn' from status).
    path = write_config(tmp_path, broker, ingest={"parallelism": 1},
                        extra={"compactor": {"min_files": 2},
                               "monitoring": {"commit_age_warn_intervals": 100_000.0,
                                              "commit_age_critical_intervals": 200_000.0}})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    for batch in range(3):  # three commits: files for the compactor
        produce_values(config, [event(i) for i in range(batch * 40, batch * 40 + 40)], batch % 2, 2)
        ingest_until(config, {0: 80 if batch >= 2 else 40, 1: 40 if batch >= 1 else 0})
    produce_values(config, [b"{not json", b"\xff\xfe"], 1, 2)  # two dead letters, with their reasons
    ingest_until(config, {0: 80, 1: 42})
    produce_values(config, [event(i) for i in range(1000, 1025)], 0, 2)  # a lag: 25 records not ingested
    catalog = load_catalog(config.catalog)
    for n, identifier in enumerate(LAKE):
        lake = config.model_copy(update={"table": config.table.model_copy(update={"identifier": identifier})})
        table = ensure_table(catalog, lake.table)
        with table.transaction() as tx:
            tx.set_properties({"streamberg.maintain.enabled": "false", "streamberg.govern.min_interval_seconds": "0"})
        ingest = FakeIngest(lake, seed=n)
        for _ in range(2 + n):
            ingest.append(30 * (n + 1), days=1)
    base = config
    tables = GovernedTables(path, ["lake"], base.govern.replan_seconds)
    service = build_service(path, base.govern, base, spark, executors, tables=tables)
    service.round()  # real actions on the shared session: the action log and the queue have content
    stop = threading.Event()

    class Args:
        dashboard = f"127.0.0.1:{free_port()}"
        dashboard_token_file = None
        dashboard_refresh = 1.0

    collect = dashboard.governed_collector(lambda: [k.config for k in list(service.kept.values())],
                                           service.tables.refusals, base.ingest.state_dir, service.runtime_of)
    server = dashboard.start(Args, base, collect, stop)
    assert server is not None
    url = f"http://127.0.0.1:{server.server_port}/"
    wait_for(lambda: _get(url + "api/fleet.json")[0] == 200 and
          len(json.loads(_get(url + "api/fleet.json")[1])["rows"]) == 4,
             120, "the model never held the four tables")
    try:
        yield {"url": url, "config": config, "path": path, "catalog": catalog, "service": service}
    finally:
        stop.set()
        server.shutdown()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# The rows as shown at one moment, read in one call (the page replaces them at each refresh).
_ROWS = """
const heads = Array.from(document.querySelectorAll('#fleet thead th')).map(th => th.textContent.trim());
return Array.from(document.querySelectorAll('#fleet tbody tr')).map(tr => ({
  table: tr.dataset.table, visible: !tr.hidden,
  cells: Object.fromEntries(Array.from(tr.cells).map((td, i) => [heads[i], td.innerText.trim()])),
  lag: tr.cells[2].dataset.value}));
"""


def _rows(driver) -> list[dict]:
    return driver.execute_script(_ROWS)


def _cells(driver, table: str) -> dict[str, str]:
    return next(r["cells"] for r in _rows(driver) if r["table"] == table)


def _visible_tables(driver) -> list[str]:
    return [r["table"] for r in _rows(driver) if r["visible"]]


@needs_browser
@pytest.mark.slow
def test_the_fleet_as_a_person_sees_it(kept) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.runbooks.inprocess import cli

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    config = kept["config"]
    driver = _browser()
    try:
        driver.get(kept["url"])
        wait_for(lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes"), 30,
                 "the page never refreshed from the API")
        assert sorted(_visible_tables(driver)) == sorted(["db.events", *LAKE])
        # The numbers equal `status --json` for the same table (nothing moves now).
        status = json.loads(cli("status", "--config", str(kept["path"]), "--json", check=False).stdout)
        shown = _cells(driver, "db.events")
        plain = {k: v.replace(",", "") for k, v in shown.items()}
        assert plain["lag (records)"] == str(status["ingest"]["lag"]["total"]) == "25", (shown, status["ingest"]["lag"])
        assert plain["files"] == str(status["files"]["data_files"]), (shown, status["files"])
        assert plain["small"] == str(status["files"]["small_files"])
        assert plain["pending bytes"] == str(status["compactor"]["pending_bytes"])
        assert shown["health"] == status["health"]["verdict"]
        # The lag in seconds: the oldest of the 25 waiting records, older at each check.
        assert 0 < float(shown["lag (s)"].removesuffix(" s")) <= status["ingest"]["lag"]["seconds"] + 0.1
        driver.save_screenshot(str(ARTIFACTS / "dashboard-fleet.png"))

        # Sorting: by lag, ascending then descending (unknown lags last).
        header = driver.find_element(By.CSS_SELECTOR, '#fleet thead th[data-key="lag_records"]')
        header.click()
        known = [int(r["lag"]) for r in _rows(driver) if r["lag"]]
        assert len(known) >= 2 and known == sorted(known) and header.get_attribute("aria-sort") == "ascending"
        header.click()
        known = [int(r["lag"]) for r in _rows(driver) if r["lag"]]
        assert known == sorted(known, reverse=True)
        # Filtering: by name, by namespace, then all again.
        driver.find_element(By.ID, "filter-text").send_keys("t02")
        assert _visible_tables(driver) == ["lake.t02"]
        driver.find_element(By.ID, "filter-text").clear()
        driver.execute_script("document.getElementById('filter-text').dispatchEvent(new Event('input'))")
        Select(driver.find_element(By.ID, "filter-namespace")).select_by_visible_text("lake")
        assert sorted(_visible_tables(driver)) == list(LAKE)
        Select(driver.find_element(By.ID, "filter-namespace")).select_by_index(0)
        assert len(_visible_tables(driver)) == 4

        # A bad policy value: its reason and the runbook link appear within one refresh.
        table = kept["catalog"].load_table("lake.t02")
        with table.transaction() as tx:
            tx.set_properties({"streamberg.compact.merge_factor": "-3"})
        wait_for(lambda: "merge_factor" in _cells(driver, "lake.t02")["reasons"], 30,
                 "the bad value never showed on the fleet page")
        # Filtering by policy: its problems, set by table properties, or the config's and defaults.
        policy = Select(driver.find_element(By.ID, "filter-policy"))
        policy.select_by_visible_text("problems")
        assert _visible_tables(driver) == ["lake.t02"]
        policy.select_by_visible_text("table properties")
        assert sorted(_visible_tables(driver)) == ["lake.t01", "lake.t03"]
        policy.select_by_visible_text("config and defaults")
        assert _visible_tables(driver) == ["db.events"]
        policy.select_by_index(0)
        assert len(_visible_tables(driver)) == 4
        link = driver.find_element(By.XPATH, '//tr[@data-table="lake.t02"]//td[@class="reasons"]'
                                             '/div[contains(., "merge_factor")]/a[@class="runbook"]')
        assert link.get_attribute("href").endswith("/runbooks/governor-action-failing")
        driver.save_screenshot(str(ARTIFACTS / "dashboard-fleet-unhealthy.png"))
        link.click()
        assert "governor" in driver.find_element(By.TAG_NAME, "body").text.lower()
        driver.back()

        # A table's page: its settings and where each came from, charts, actions.
        origins = "return Array.from(document.querySelectorAll('#settings tbody tr')).map(r => [r.cells[0].innerText, r.cells[3].innerText]);"
        driver.get(kept["url"] + "table/db.events")
        settings = dict(driver.execute_script(origins))
        assert settings["streamberg.compact.min_files"] == "config" and settings["streamberg.snapshots.keep"] == "default"
        driver.get(kept["url"] + "table/lake.t02")
        settings = dict(driver.execute_script(origins))
        assert settings["streamberg.maintain.enabled"] == "table property"
        assert settings["streamberg.compact.merge_factor"] != "table property"  # refused: not applied
        assert "merge_factor" in driver.find_element(By.ID, "reasons").text
        assert driver.find_elements(By.CSS_SELECTOR, "#chart-data_files polyline")
        driver.save_screenshot(str(ARTIFACTS / "dashboard-table.png"))
        # The newest dead letters with their reasons, as the dead-letter table holds them.
        driver.get(kept["url"] + "table/db.events")
        shown = driver.execute_script("return Array.from(document.querySelectorAll('#dead-letters tbody tr'))"
                                      ".map(r => [Number(r.cells[2].innerText), Number(r.cells[3].innerText), "
                                      "r.cells[4].innerText]);")
        held = kept["catalog"].load_table(config.ingest_target.dead_letter_table).scan(
            selected_fields=("partition", "offset", "reason")).to_arrow().to_pylist()
        assert len(held) == 2 and all(r["reason"] for r in held)
        assert sorted(map(tuple, shown)) == sorted((r["partition"], r["offset"], r["reason"]) for r in held)
        assert "2" in driver.find_element(By.ID, "fact-dead").text
        ran = kept["service"].governor.log_entries[-1]  # the round's action, on the table it chose
        driver.get(kept["url"] + "table/" + ran["table"])
        assert ran["action"] in driver.find_element(By.ID, "actions").text and "ok" in \
            driver.find_element(By.ID, "actions").text
        # The governor's page: the heartbeat, the last actions.
        driver.get(kept["url"] + "governor")
        assert "compact" in driver.find_element(By.ID, "log").text
        driver.save_screenshot(str(ARTIFACTS / "dashboard-governor.png"))
        assert _severe(driver) == []
    finally:
        driver.quit()
    # The pages read the model the metrics read: the same table label, the same lag.
    status, text = _get(kept["url"] + "metrics")
    assert status == 200 and f'streamberg_ingest_lag_records{{partition="0",table="db.events",topic="{config.kafka.topic}"}}' \
        in text


def test_off_loopback_the_dashboard_needs_a_token(tmp_path: Path) -> None:
    from streamberg.monitoring.dashboard.app import DashboardRefused, make_app, serve_dashboard
    from streamberg.monitoring.fleet import FleetStatus
    from streamberg.monitoring.metrics import fleet_families
    from streamberg.monitoring.watch import Watch

    watch = Watch(lambda: FleetStatus(), fleet_families, 60.0)
    watch.refresh()
    with pytest.raises(DashboardRefused):
        serve_dashboard(make_app(watch, str(tmp_path)), "0.0.0.0", free_port(), None)
    token = "a-token-of-thirty-two-characters"
    server, _ = serve_dashboard(make_app(watch, str(tmp_path), token), "0.0.0.0", free_port(), token)
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        assert _get(url)[0] == 401 and _get(url + "api/fleet.json")[0] == 401 and _get(url + "metrics")[0] == 401
        assert _get(url, {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(url, {"Authorization": f"Bearer {token}"})[0] == 200
        assert _get(url + "healthz")[0] == 200  # the probes answer without it (they say nothing of the tables)
        request = urllib.request.Request(url + "api/fleet.json", data=b"{}", method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("a POST was accepted")
        except urllib.error.HTTPError as exc:
            assert exc.code == 405  # read-only
    finally:
        server.shutdown()


@needs_browser
@pytest.mark.slow
def test_a_stopped_broker_shows_its_reason_within_one_refresh(tmp_path: Path) -> None:
    """A table whose broker stops (a broker of its own, started for this test): the fleet page
    turns it critical with the broker's reason and the runbook link, without a reload."""
    from selenium.webdriver.common.by import By

    from streamberg.cli import dashboard
    from streamberg.common.broker import EmbeddedBroker
    from streamberg.ingest.dead_letters import open_tables

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    own = EmbeddedBroker(tmp_path / "broker")
    info = own.start(port=free_port())
    stop = threading.Event()
    server = driver = None
    try:
        config = config_at(write_config(tmp_path, info.bootstrap))
        ensure_topic(info.bootstrap, config.kafka.topic, 1)
        open_tables(config)
        name = config.table.identifier

        class Args:
            dashboard = f"127.0.0.1:{free_port()}"
            dashboard_token_file = None
            dashboard_refresh = 1.0

        collect = dashboard.governed_collector(lambda: [config], dict, config.ingest.state_dir)
        server = dashboard.start(Args, config, collect, stop)
        assert server is not None
        driver = _browser()
        driver.get(f"http://127.0.0.1:{server.server_port}/")
        wait_for(lambda: any(r["table"] == name for r in _rows(driver)), 60, "the table never showed")
        assert "broker" not in _cells(driver, name)["reasons"]
        own.stop()
        wait_for(lambda: "broker unreachable" in _cells(driver, name)["reasons"], 60,
                 "the stopped broker never showed on the page")
        assert _cells(driver, name)["health"] == "critical"
        link = driver.find_element(By.XPATH, f'//tr[@data-table="{name}"]//td[@class="reasons"]'
                                             '/div[contains(., "broker unreachable")]/a[@class="runbook"]')
        assert link.get_attribute("href").endswith("/runbooks/ingest-lag")
        assert int(driver.find_element(By.ID, "sum-critical").text) == 1
        driver.save_screenshot(str(ARTIFACTS / "dashboard-broker-stopped.png"))
        assert _severe(driver) == []
    finally:
        if driver is not None:
            driver.quit()
        stop.set()
        if server is not None:
            server.shutdown()
        own.stop()
