"""A hostile fleet (issue 38, items 4 to 6), driven in process: the real Writers and
Committers on a real broker, a SQLite catalog and Parquet files, read back by pyiceberg.

- Side-table names: `raw.{topic}` over a pattern, a topic `ev.a_dead_letters` beside `ev.a`
  in both orders, a data table an earlier release let take `ev4.c`'s dead-letter name, and
  a route value that becomes `shop.books_dead_letters` under `shop.{cat}s`. Each time the one
  topic or value is refused (status can say why) and every other table commits its records
  exactly once; nothing is written into a table that is not what it should be.
- Caps: `max_tables_per_route: 3` with two writers (parallelism 2) racing for new route
  values makes exactly 3 tables, a pattern route exactly 3, and `ingest.max_tables` bounds
  the job; every record is in a table or a dead letter, once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig, load_fleet
from streamberg.ingest.committers import Committers
from streamberg.ingest.writer import Writer
from tests.ingest.test_fleet import _event, _produce, _rows


def _write(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _drive(writers, committer, until, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, ("the fleet did not get there in time",
                                             [sorted(w.lanes) for w in writers], committer.paused)
        for writer in writers:
            for unit in writer.poll():
                committer.offer(unit)


def _count(catalog, identifier: str) -> int:
    try:
        return len(_rows(catalog, identifier))
    except Exception:  # noqa: BLE001 - not made yet
        return -1


def test_side_table_names_refuse_one_topic_or_value_never_the_job(tmp_path: Path, broker: str) -> None:
    p = f"h{int(time.time() * 1000) % 100000}-"
    n = p.replace("-", "_")
    path = _write(tmp_path, {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{n}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5, "table_failures_to_pause": 3}},
        "tables": [{"identifier": "raw.{topic}", "topic_pattern": f"{p}ev.*", "schema": "infer"},
                   {"identifier": "shop.{cat}s", "topics": [f"{p}shop"], "route_field": "cat", "schema": "infer"}],
    })
    fleet = load_fleet(path)
    catalog = load_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{p}ev.a")["catalog"]))
    # An earlier release let topic ev4.c_dead_letters make a data table with ev4.c's dead-letter name.
    catalog.create_namespace("raw")
    taken = f"raw.{n}ev4_c_dead_letters"
    catalog.create_table(taken, schema=Schema(NestedField(1, "id", LongType(), required=False)),
                         properties={"streamberg.route.topic": f"{p}ev4.c_dead_letters"})

    # Order one: ev.a first, its namesake later. Order two: ev3.c_dead_letters before ev3.c.
    _produce(broker, f"{p}ev.a", [_event(i) for i in range(20)] + [b"not json"])
    _produce(broker, f"{p}ev3.c_dead_letters", [_event(i) for i in range(7)])
    _produce(broker, f"{p}shop", [json.dumps({"id": i, "cat": "book"}).encode() for i in range(10)]
             + [json.dumps({"id": 100 + i, "cat": "books_dead_letter"}).encode() for i in range(5)])
    writer, committer = Writer(fleet, 0, 1, "side-1"), Committers(fleet, 1, "side-1")
    writer.open()
    committer.open()
    try:
        _drive([writer], committer, lambda: _count(catalog, f"raw.{n}ev_a") == 20 and _count(catalog, "shop.books") == 10)
        _produce(broker, f"{p}ev.a_dead_letters", [_event(i) for i in range(9)])
        _produce(broker, f"{p}ev3.c", [_event(i) for i in range(11)])
        _produce(broker, f"{p}ev4.c", [_event(i) for i in range(13)])
        _produce(broker, f"{p}ev.b", [_event(i) for i in range(15)])
        _drive([writer], committer, lambda: _count(catalog, f"raw.{n}ev3_c") == 11 and _count(catalog, f"raw.{n}ev_b") == 15
               and f"raw.{n}ev4_c" in committer.paused and f"{p}ev.a_dead_letters" in writer.tables.refused)
        for unit in writer.finish():
            committer.offer(unit)
    finally:
        writer.close()
        committer.close()

    refused = writer.tables.refused
    assert "side table" in refused[f"{p}ev.a_dead_letters"] and "side table" in refused[f"{p}ev3.c_dead_letters"]
    assert "not a dead-letter table" in committer.paused[f"raw.{n}ev4_c"], committer.paused
    assert json.loads((Path(fleet.defaults.ingest.state_dir) / "runs" / "side-1" / "paused-tables.json")
                      .read_text()).keys() == {f"raw.{n}ev4_c"}
    for table, count in ((f"raw.{n}ev_a", 20), (f"raw.{n}ev3_c", 11), (f"raw.{n}ev_b", 15), ("shop.books", 10)):
        ids = _rows(catalog, table)
        assert len(ids) == len(set(ids)) == count, (table, len(ids))
        assert "streamberg.route.topic" not in catalog.load_table(f"{table}_dead_letters").properties
    # ev.a's dead letters are its own one bad record, in a dead-letter table; no namesake's data.
    letters = catalog.load_table(f"raw.{n}ev_a_dead_letters").scan().to_arrow()
    assert letters.num_rows == 1 and letters.column("topic").to_pylist() == [f"{p}ev.a"]
    assert not catalog.table_exists(f"raw.{n}ev3_c_dead_letters_dead_letters")
    assert _rows(catalog, taken) == []  # nothing written into the table that took the name
    # The value that would make shop.books_dead_letters: its records are dead letters saying why.
    unrouted = catalog.load_table("shop._unrouteds_dead_letters").scan().to_arrow()
    assert unrouted.num_rows == 5 and all("side table" in r for r in unrouted.column("reason").to_pylist())
    assert catalog.load_table("shop.books_dead_letters").scan().to_arrow().num_rows == 0

    # status names the refused topics and the paused table, and says the fleet is not well.
    from tests.runbooks.inprocess import cli

    out = cli("status", "--config", str(path), check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{p}ev.a_dead_letters" in out.stdout and f"raw.{n}ev4_c" in out.stdout, out.stdout


def test_table_caps_are_exact_across_writers(tmp_path: Path, broker: str) -> None:
    p = f"k{int(time.time() * 1000) % 100000}-"
    n = p.replace("-", "_")
    path = _write(tmp_path, {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{n}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 2,
                                "topic_discovery_seconds": 0.5, "max_tables_per_route": 3, "max_tables": 6}},
        "tables": [{"identifier": "web.clicks_{region}", "topics": [f"{p}clicks"], "route_field": "region",
                    "schema": "infer"},
                   {"identifier": "raw.{topic}", "topic_pattern": f"{p}ev.*", "schema": "infer"},
                   {"identifier": "shop.extra", "topics": [f"{p}extra"], "schema": "infer"}],
    })
    fleet = load_fleet(path)
    catalog = load_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{p}clicks")["catalog"]))
    regions = ["r1", "r2", "r3", "r4", "r5", "r6"]
    records = [json.dumps({"id": i, "region": regions[(i // 2) % 6]}).encode() for i in range(240)]
    _produce(broker, f"{p}clicks", records)  # both partitions carry every value: both writers race
    for t in range(5):
        _produce(broker, f"{p}ev.t{t}", [_event(i) for i in range(10)])
    _produce(broker, f"{p}extra", [_event(i) for i in range(10)])
    writers = [Writer(fleet, i, 2, "caps-1") for i in range(2)]
    committer = Committers(fleet, 2, "caps-1")
    for writer in writers:
        writer.open()
    committer.open()

    def data_tables() -> list[str]:
        have = {ns[0] for ns in catalog.list_namespaces()}
        return sorted(".".join(t) for ns in ("web", "raw", "shop") if ns in have for t in catalog.list_tables(ns)
                      if not t[1].endswith(("_dead_letters", "_unrouted")))

    def accounted() -> int:
        kept = sum(max(0, _count(catalog, t)) for t in data_tables() if t.startswith("web."))
        letters = "web.clicks__unrouted_dead_letters"
        return kept + (catalog.load_table(letters).scan().to_arrow().num_rows if catalog.table_exists(letters) else 0)

    try:
        _drive(writers, committer, lambda: accounted() >= 240)
        for writer in writers:
            for unit in writer.finish():
                committer.offer(unit)
    finally:
        for writer in writers:
            writer.close()
        committer.close()

    made = data_tables()
    values = [t for t in made if t.startswith("web.clicks_")]
    patterned = [t for t in made if t.startswith("raw.")]
    # 3 a route at most, 6 in the job exactly (3 values + 3 topics + shop.extra asked for 7).
    assert len(made) == 6 and len(values) <= 3 and len(patterned) <= 3, made
    assert set(patterned) <= {f"raw.{n}ev_t{t}" for t in range(3)}  # recorded first, then sorted
    kept = {t: _rows(catalog, t) for t in values}
    letters = catalog.load_table("web.clicks__unrouted_dead_letters").scan().to_arrow()
    assert all("max_tables" in r for r in letters.column("reason").to_pylist())
    assert sum(len(ids) for ids in kept.values()) + letters.num_rows == 240  # each record once
    assert all(len(ids) == len(set(ids)) == 40 for ids in kept.values()), {t: len(i) for t, i in kept.items()}
    for writer in writers:  # the pattern route's fourth and fifth topics, whichever writer looked
        assert sum("max_tables_per_route" in why for why in writer.tables.refused.values()) == 2, writer.tables.refused
    # Whatever the job cap left out is named: a refused value's records, or a paused table.
    assert len(values) == 3 or any("max_tables" in r for r in letters.column("reason").to_pylist())
    assert len(made) + len(committer.paused) + (3 - len(values)) >= 7


def test_a_forged_route_record_is_reported_under_its_own_name(tmp_path: Path, broker: str) -> None:
    """A table anyone made in the route's namespace claiming the route's topic with a value no
    route value can be (`x-y`), and one claiming a valid value under another name: ingest,
    status and `govern --dry-run` go on, naming `web.decoy` and `web.decoy2`, never a made-up name."""
    p = f"g{int(time.time() * 1000) % 100000}-"
    n = p.replace("-", "_")
    path = _write(tmp_path, {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{n}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5}},
        "tables": [{"identifier": "web.clicks_{region}", "topics": [f"{p}clicks"], "route_field": "region",
                    "schema": "infer"}],
    })
    fleet = load_fleet(path)
    catalog = load_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{p}clicks")["catalog"]))
    catalog.create_namespace("web")
    for name, value in (("web.decoy", "x-y"), ("web.decoy2", "eu")):
        catalog.create_table(name, schema=Schema(NestedField(1, "id", LongType(), required=False)),
                             properties={"streamberg.route.topic": f"{p}clicks", "streamberg.route.value": value})
    _produce(broker, f"{p}clicks", [json.dumps({"id": i, "region": "eu"}).encode() for i in range(12)])
    writer, committer = Writer(fleet, 0, 1, "forged-1"), Committers(fleet, 1, "forged-1")
    writer.open()
    committer.open()
    try:
        _drive([writer], committer, lambda: _count(catalog, "web.clicks_eu") == 12)
    finally:
        writer.close()
        committer.close()
    assert set(writer.refused_tables) == {"web.decoy", "web.decoy2"}, writer.refused_tables
    assert _rows(catalog, "web.decoy2") == [] and _rows(catalog, "web.decoy") == []

    from tests.helpers import streamberg
    from tests.runbooks.inprocess import cli

    out = cli("status", "--config", str(path), "--json", check=False)
    assert "Traceback" not in out.stderr and "clicks_x-y" not in out.stdout + out.stderr
    document = json.loads(out.stdout)
    assert set(document["refused_tables"]) == {"web.decoy", "web.decoy2"}, document["refused_tables"]
    proc = streamberg("govern", "--config", str(path), "--dry-run", "--json", check=False)
    assert proc.returncode == 0 and "clicks_x-y" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert {"web.decoy", "web.decoy2"} <= set(json.loads(proc.stdout)["problems"])


def test_a_catalog_down_while_a_writer_opens_its_tables_delays_them_never_pauses_them(
        tmp_path: Path, broker: str, rest_catalog) -> None:
    """A failure another moment may not have (here a REST catalog answering 503, as the
    catalog's SQLite database "locked" did in a CI run) when a writer opens a table: the
    topic is routed again with backoff, not refused and paused for the run."""
    p = f"d{int(time.time() * 1000) % 100000}-"
    n = p.replace("-", "_")
    secret = tmp_path / "credential"
    secret.write_text(rest_catalog.credential + "\n")
    secret.chmod(0o600)
    path = _write(tmp_path, {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"r{n}", "type": "rest", "uri": rest_catalog.url, "warehouse": "tests",
                    "credential_file": str(secret), "allow_insecure": True},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5, "table_failures_to_pause": 8}},
        "tables": [{"identifier": "down.{topic}", "topics": [f"{p}a", f"{p}b"], "schema": "infer"}],
    })
    fleet = load_fleet(path)
    _produce(broker, f"{p}a", [_event(i) for i in range(20)])
    _produce(broker, f"{p}b", [_event(i) for i in range(15)])
    catalog = load_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{p}a")["catalog"]))
    writer, committer = Writer(fleet, 0, 1, "down-1"), Committers(fleet, 1, "down-1")
    committer.open()
    rest_catalog.down = True
    try:
        writer.open()
        assert set(writer.tables.waiting) == {f"{p}a", f"{p}b"} and not writer.tables.refused, \
            (writer.tables.waiting, writer.tables.refused)
    finally:
        rest_catalog.down = False
    try:
        _drive([writer], committer, lambda: _count(catalog, f"down.{n}a") == 20 and _count(catalog, f"down.{n}b") == 15)
    finally:
        writer.close()
        committer.close()
    assert not committer.paused and not writer.tables.refused, (committer.paused, writer.tables.refused)
    assert sorted(_rows(catalog, f"down.{n}a")) == list(range(20))
    assert sorted(_rows(catalog, f"down.{n}b")) == list(range(15))
