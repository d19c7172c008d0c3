"""`streamberg replay` and `streamberg table --evolve` against a real broker and a real table.

The table is filled by the real ingest code (writer + committer, in-process: see
inprocess.py); the replays run through the real `streamberg` entry point, in-process (`cli`)
and, where the process boundary matters (exit codes), as a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
from pyiceberg.io.pyarrow import schema_to_pyarrow

from streamberg.common.catalog import load_catalog
from streamberg.table_meta.field_sightings import sightings_of
from streamberg.table_meta.offsets import committed_position, summary_properties
from streamberg.table_meta.summary_keys import dlq_replayed_key, replay_range_key
from tests.helpers import config_at, dead_letters, duplicates, streamberg, table_ids, write_config
from tests.runbooks.inprocess import cli, event, ingest_until, produce_values, schema_change_events

PARTITIONS = 2


def _json(proc) -> dict:
    return json.loads(proc.stdout)


def _position(config):
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return committed_position(table, config.kafka.topic)


def _table(path: Path) -> dict:
    return _json(cli("table", "--config", str(path), "--json"))


@pytest.fixture
def ingested(tmp_path: Path, broker: str):
    """Partition 0: ids 0..99 at offsets 0..99 except 3 malformed ones; partition 1: ids 1000..1049."""
    path = write_config(tmp_path, broker)
    config = config_at(path)
    bad = {10: b"not json {", 55: b"[1, 2]", 77: event(77, amount="lots")}
    produce_values(config, [bad.get(i, event(i)) for i in range(100)], partition=0, partitions=PARTITIONS)
    produce_values(config, [event(1000 + i) for i in range(50)], partition=1, partitions=PARTITIONS)
    ingest_until(config, {0: 100, 1: 50})
    valid = sorted([i for i in range(100) if i not in bad] + list(range(1000, 1050)))
    assert table_ids(config) == valid
    return path, config, valid, bad


def test_range_replay_adds_the_lost_rows_once_and_never_moves_the_ingest(ingested) -> None:
    path, config, valid, bad = ingested
    before = _position(config)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    table.delete(And(GreaterThanOrEqual("id", 20), LessThan("id", 40)))  # rows lost by mistake
    assert _table(path)["reconciles"] is False

    dry = _json(cli("replay", "--config", str(path), "--partition", "0", "--from-offset", "20",
                    "--to-offset", "40", "--dry-run"))
    assert (dry["read"], dry["records_added"], dry["snapshot_id"]) == (20, 20, None)
    assert table_ids(config) == [i for i in valid if not 20 <= i < 40]  # a dry run changes nothing

    out = _json(cli("replay", "--config", str(path), "--partition", "0", "--from-offset", "20",
                    "--to-offset", "40"))
    assert (out["read"], out["records_added"], out["still_bad"]) == (20, 20, 0)
    ids = table_ids(config)
    assert ids == valid and not duplicates(ids)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    summary = summary_properties(table.current_snapshot())
    assert table.current_snapshot().snapshot_id == out["snapshot_id"]
    assert json.loads(summary[replay_range_key(config.kafka.topic)]) == {"0": [20, 40]}
    after = _position(config)
    assert (after.offsets, after.snapshot_id, after.consumed_total) == (before.offsets, before.snapshot_id,
                                                                         before.consumed_total)
    assert _table(path)["reconciles"] is True

    # The same range, or any range overlapping it, is refused; --force overrides.
    for run, (start, end) in ((streamberg, (20, 40)), (cli, (35, 60)), (cli, (0, 21))):
        again = run("replay", "--config", str(path), "--partition", "0", "--from-offset", str(start),
                    "--to-offset", str(end), check=False)
        assert again.returncode == 1 and "overlaps" in again.stderr and "[20, 40)" in again.stderr, again.stderr
    forced = _json(cli("replay", "--config", str(path), "--partition", "0", "--from-offset", "20",
                       "--to-offset", "40", "--force", "--dry-run"))
    assert forced["records_added"] == 20
    # A range containing dead-lettered records replays the valid ones; the bad ones stay put.
    mixed = _json(cli("replay", "--config", str(path), "--partition", "0", "--from-offset", "50",
                      "--to-offset", "60", "--dry-run"))
    assert (mixed["records_added"], mixed["still_bad"], mixed["dead_letters_added"]) == (9, 1, 0)
    assert table_ids(config) == valid


def test_ranges_the_ingest_has_not_committed_are_refused(ingested) -> None:
    path, config, valid, _ = ingested
    committed = _position(config).offsets[0]
    beyond = cli("replay", "--config", str(path), "--partition", "0", "--from-offset", str(committed - 5),
                 "--to-offset", str(committed + 1), check=False)
    assert beyond.returncode == 1
    assert f"beyond the ingest's committed offset {committed}" in beyond.stderr, beyond.stderr
    unknown = cli("replay", "--config", str(path), "--partition", "7", "--from-offset", "0",
                  "--to-offset", "1", check=False)
    assert unknown.returncode == 1 and "no committed ingest offset" in unknown.stderr
    usage = streamberg("replay", "--config", str(path), "--partition", "0", "--from-offset", "5", check=False)
    assert usage.returncode == 2 and "--to-offset" in usage.stderr
    assert table_ids(config) == valid


def _evolved_config(path: Path, **changes: dict) -> Path:
    """A copy of the config with schema fields changed (name -> field dict, None drops it)."""
    document = yaml.safe_load(path.read_text())
    fields = {f["name"]: f for f in document["table"]["schema"]}
    for name, field in changes.items():
        if field is None:
            fields.pop(name)
        else:
            fields[name] = {"name": name, **field}
    document["table"]["schema"] = list(fields.values())
    target = path.with_name(f"evolved-{len(list(path.parent.glob('evolved-*')))}.yaml")
    target.write_text(yaml.safe_dump(document, sort_keys=False))
    return target


def test_dead_letters_land_after_evolve_exactly_once(tmp_path: Path, broker: str) -> None:
    # The operator's path: the ingest does not add fields itself (ingest.schema_evolution: off).
    path = write_config(tmp_path, broker, ingest={"schema_evolution": "off"})
    config = config_at(path)
    # Anonymous events (no user_id, required in the table) and events carrying a new field.
    values = schema_change_events(valid=range(40), anonymous=range(100, 112), with_device=range(200, 205),
                                  poison=b"still not json")
    produce_values(config, values, partition=0, partitions=1)
    ingest_until(config, {0: len(values)})
    before = _position(config)
    assert dead_letters(config).num_rows == 13
    # The field not written is counted in the table, never dropped in silence.
    seen = sightings_of(summary_properties(load_catalog(config.catalog).load_table(
        config.table.identifier).current_snapshot()))
    assert seen["device"].records == 5 and seen["device"].first == {0: 52} and seen["device"].last == {0: 56}

    dry = _json(cli("replay", "--config", str(path), "--dead-letters", "--dry-run"))
    assert dry["read"] == 13 and dry["records_added"] == 0  # nothing decodes yet
    assert dry["candidates_by_reason"]["missing required field 'user_id'"] == 12

    refused = cli("table", "--config", str(_evolved_config(path, amount={"type": "long"})), "--evolve",
                  check=False)
    assert refused.returncode == 1 and "'amount' is double in the table but long" in refused.stderr
    required = cli("table", "--config", str(_evolved_config(path, region={"type": "string", "required": True})),
                   "--evolve", check=False)
    assert required.returncode == 1 and "'region'" in required.stderr
    dropped = cli("table", "--config", str(_evolved_config(path, user_id=None, device={"type": "string"})), "--evolve",
                  check=False)
    assert dropped.returncode == 1 and "'user_id' is required in the table but missing" in dropped.stderr
    assert "device" not in load_catalog(config.catalog).load_table(config.table.identifier).schema().column_names

    new = _evolved_config(path, user_id={"type": "string"}, device={"type": "string"})
    plan = _json(cli("table", "--config", str(new), "--evolve", "--dry-run", "--json"))
    assert plan["added"] == [{"name": "device", "type": "string"}] and plan["made_optional"] == ["user_id"]
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert table.schema().find_field("user_id").required and "device" not in table.schema().column_names
    cli("table", "--config", str(new), "--evolve")
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert not table.schema().find_field("user_id").required and "device" in table.schema().column_names
    assert _json(cli("table", "--config", str(new), "--evolve", "--json"))["changes"] == []

    # Dead letters from the future: none.
    assert _json(cli("replay", "--config", str(new), "--dead-letters", "--since", "2099-01-01T00:00:00Z"))["read"] == 0
    # A range replay over dead-lettered offsets (40..45 hold anonymous events) lands the ones
    # that now decode and moves them out of the DLQ, so the DLQ replay cannot land them again.
    ranged = _json(cli("replay", "--config", str(new), "--partition", "0", "--from-offset", "40", "--to-offset", "46"))
    assert (ranged["read"], ranged["records_added"], ranged["removed_from_dlq"]) == (6, 6, 6)
    out = _json(cli("replay", "--config", str(new), "--dead-letters", "--reason-like", "missing required%"))
    assert (out["read"], out["records_added"], out["still_bad"], out["removed_from_dlq"]) == (6, 6, 0, 6)
    ids = table_ids(config)
    assert ids == sorted(list(range(40)) + [100 + i for i in range(12)] + [200 + i for i in range(5)])
    assert dead_letters(config).column("value").to_pylist() == [b"still not json"]
    landed = json.loads(summary_properties(
        load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot())[dlq_replayed_key(config.kafka.topic)])
    assert landed == {"0": list(range(46, 52))}
    after = _position(config)
    assert (after.offsets, after.consumed_total) == (before.offsets, before.consumed_total)
    assert _table(new)["reconciles"] is True

    # Nothing twice: a second run finds only the record that still does not decode.
    second = _json(cli("replay", "--config", str(new), "--dead-letters"))
    assert (second["read"], second["records_added"], second["still_bad"]) == (1, 0, 1)
    # A crash between the append and the DLQ delete leaves landed rows in the DLQ: the next
    # run removes them instead of adding them again.
    dlq = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table)
    lost = dead_letters(config).slice(0, 1).to_pylist()[0]
    dlq.append(pa.Table.from_pylist([{**lost, "offset": 45}], schema=schema_to_pyarrow(dlq.schema())))
    repaired = _json(cli("replay", "--config", str(new), "--dead-letters"))
    assert (repaired["records_added"], repaired["removed_from_dlq"]) == (0, 1)
    assert table_ids(config) == ids and not duplicates(table_ids(config))
