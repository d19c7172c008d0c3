"""Config errors: each bad key gives a clear message naming it, and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamberg.cli.main import main
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError
from tests.helpers import write_config


def _mutate(path: Path, change) -> Path:
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def good_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, "127.0.0.1:1", "t")


BAD = {
    "kafka.topic": (lambda d: d["kafka"].pop("topic"), "kafka.topic: Field required"),
    "kafka.start_offset": (lambda d: d["kafka"].update(start_offset="middle"), "kafka.start_offset"),
    "kafka.consumer": (lambda d: d["kafka"].update(consumer={"group.id": "x"}), "kafka.consumer: group.id are set by streamberg"),
    "kafka.unknown": (lambda d: d["kafka"].update(bootstrap="x"), "kafka.bootstrap: Extra inputs are not permitted"),
    "catalog.uri": (lambda d: d["catalog"].update(uri="catalog.db"), "catalog.uri: must be a SQLAlchemy URI"),
    "table.identifier": (lambda d: d["table"].update(identifier="events"), "table.identifier"),
    "table.schema.type": (lambda d: d["table"]["schema"][1].update(type="timestmp"), "table.schema.1.type: unknown type 'timestmp'"),
    "table.partition_spec.source": (lambda d: d["table"].update(partition_spec=[{"source": "nope", "transform": "day"}]),
                                    "partition_spec.0.source: 'nope' is not a schema field"),
    "table.partition_spec.transform": (lambda d: d["table"].update(partition_spec=[{"source": "id", "transform": "bucket[x]"}]),
                                       "table.partition_spec.0.transform: unknown transform"),
    "day on a string": (lambda d: d["table"].update(partition_spec=[{"source": "user_id", "transform": "day"}]),
                        "partition_spec.0.transform: day needs a date/timestamp field"),
    "ingest.commit_interval_seconds": (lambda d: d["ingest"].update(commit_interval_seconds=0),
                                       "ingest.commit_interval_seconds: must be a number > 0"),
    "ingest.parallelism": (lambda d: d["ingest"].update(parallelism="two"), "ingest.parallelism"),
    "unknown section": (lambda d: d.update(ingset={}), "ingset: Extra inputs are not permitted"),
    "epoch unit value": (lambda d: d["table"]["schema"][1].update(unit="millis"), "table.schema.1.unit: Input should be 's', 'ms', 'us' or 'ns'"),
    "epoch unit on a string": (lambda d: d["table"]["schema"][2].update(unit="ms"),
                               "table.schema.2.unit: an epoch unit only applies to timestamp/timestamptz fields, this one is string"),
    "duplicate field": (lambda d: d["table"]["schema"].append({"name": "id", "type": "long"}), "duplicate field names ['id']"),
    # Beyond what librdkafka takes for the writers' fetch sizes: it used to validate, then
    # crash-loop every writer.
    "ingest.max_record_bytes": (lambda d: d["ingest"].update(max_record_bytes=600_000_000),
                                "ingest.max_record_bytes: must be an integer between 1 and 500000000"),
    "yes is no boolean": (lambda d: d.update(maintenance={"allow_location_outside_warehouse": "yes"}),
                          "maintenance.allow_location_outside_warehouse: must be true or false"),
    "on_lost_offsets": (lambda d: d["ingest"].update(on_lost_offsets="skip"), "ingest.on_lost_offsets"),
    # The fleet's own mark for a field-routed table: in a one-table file it would filter the
    # table's fresh reads down to nothing.
    "route_field": (lambda d: d.update(route_field="region"), "route_field: not a setting of a one-table file"),
    "ingest.engine": (lambda d: d["ingest"].update(engine="spark"), "ingest.engine"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_key_is_named(good_config: Path, case: str) -> None:
    change, expected = BAD[case]
    _mutate(good_config, change)
    with pytest.raises(ConfigError) as error:
        load_config(good_config)
    assert expected in str(error.value)
    # ...and the CLI turns it into exit code 2 before anything starts.
    assert main(["table", "--config", str(good_config)]) == 2


def test_epoch_unit_is_optional_and_read_per_field(good_config: Path) -> None:
    from streamberg.decode.json_decode import epoch_units

    assert epoch_units(load_config(good_config).table.schema_) == {}  # ms by default, in the decoder
    _mutate(good_config, lambda d: d["table"]["schema"][1].update(unit="us"))
    assert epoch_units(load_config(good_config).table.schema_) == {"ts": "us"}


def test_good_config_loads_and_resolves_paths(good_config: Path) -> None:
    config = load_config(good_config)
    assert config.catalog.uri == f"sqlite:///{good_config.parent / 'catalog.db'}"
    assert config.catalog.warehouse == f"file://{good_config.parent / 'warehouse'}"
    assert config.ingest_target.dead_letter_table == "db.events_dead_letters"


def test_environment_overrides_the_file(good_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMBERG_KAFKA__BOOTSTRAP_SERVERS", "broker:9093")
    monkeypatch.setenv("STREAMBERG_INGEST__PARALLELISM", "3")
    config = load_config(good_config)
    assert config.kafka.bootstrap_servers == "broker:9093"
    assert config.ingest.parallelism == 3


def test_environment_overrides_a_config_of_many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38, item 9: the same STREAMBERG_<SECTION>__<KEY> overrides reach every table of a
    config of many (ingest and table: every route's defaults); a secret given so is redacted."""
    import yaml

    from streamberg.common.config import load_fleet
    from streamberg.common.config.loading import config_from_dump
    from streamberg.common.redact import redact

    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "file-broker:9092", "consumer": {"fetch.min.bytes": 1}},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 7}},
        "tables": [{"identifier": "shop.orders", "topics": ["orders"], "schema": "infer"},
                   {"identifier": "raw.{topic}", "topic_pattern": "ev\\..*", "schema": "infer"}]}))
    monkeypatch.setenv("STREAMBERG_KAFKA__BOOTSTRAP_SERVERS", "env-broker:9093")
    monkeypatch.setenv("STREAMBERG_KAFKA__CONSUMER__SASL.PASSWORD", "hunter2-from-env")
    monkeypatch.setenv("STREAMBERG_INGEST__PARALLELISM", "3")
    monkeypatch.setenv("STREAMBERG_INGEST__STATE_DIR", "state-here")
    monkeypatch.setenv("STREAMBERG_COMPACTOR__MIN_FILES", "9")
    monkeypatch.chdir(tmp_path)
    fleet = load_fleet(tmp_path / "fleet.yaml")
    for route, topic in ((fleet.tables[0], "orders"), (fleet.tables[1], "ev.a")):
        config = config_from_dump(fleet.document(route, topic))
        assert config.kafka.bootstrap_servers == "env-broker:9093"
        assert config.kafka.consumer == {"fetch.min.bytes": 1, "sasl.password": "hunter2-from-env"}
        assert config.ingest.parallelism == 3 and config.ingest.commit_interval_seconds == 7
        assert config.ingest.state_dir == str(tmp_path / "state-here")
        assert config.compactor.min_files == 9
        assert config.catalog.uri == f"sqlite:///{tmp_path / 'catalog.db'}"  # the file's, untouched
    assert "hunter2-from-env" not in redact("broker said: bad password hunter2-from-env")
    monkeypatch.setenv("STREAMBERG_INGEST__PARALLELISM", "-1")
    with pytest.raises(ConfigError, match="parallelism"):
        load_fleet(tmp_path / "fleet.yaml")


def test_bad_environment_override_is_named(good_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMBERG_INGEST__PARALLELISM", "-1")
    with pytest.raises(ConfigError, match="ingest.parallelism: must be an integer between 1 and 256"):
        load_config(good_config)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("kafka: [unclosed")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_cli_exit_code_and_message_in_a_real_process(good_config: Path) -> None:
    _mutate(good_config, lambda d: d["ingest"].update(commit_interval_seconds=-5))
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.run([str(exe), "ingest", "--config", str(good_config)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "ingest.commit_interval_seconds" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_largest_max_record_bytes_makes_a_consumer_librdkafka_accepts(good_config: Path) -> None:
    from confluent_kafka import Consumer

    from streamberg.common.config import MAX_RECORD_BYTES
    from streamberg.common.kafka_settings import consumer_settings

    config = load_config(_mutate(good_config, lambda d: d["ingest"].update(max_record_bytes=MAX_RECORD_BYTES)))
    Consumer(consumer_settings(config)).close()  # raises KafkaException on a setting out of range


def test_relative_paths_from_the_environment_are_made_absolute(good_config: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of a run (Flink workers, the supervisor's children) must mean the same
    folder: relative paths given by environment overrides are taken from the working directory."""
    elsewhere = tmp_path / "operator"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("STREAMBERG_INGEST__STATE_DIR", "state-here")
    monkeypatch.setenv("STREAMBERG_CATALOG__URI", "sqlite:///cat.db")
    monkeypatch.setenv("STREAMBERG_CATALOG__WAREHOUSE", "wh")
    monkeypatch.setenv("STREAMBERG_COMPACTOR__CHECKPOINT_DIR", "ckpt")
    config = load_config(good_config)
    assert config.ingest.state_dir == str(elsewhere / "state-here")
    assert config.catalog.uri == f"sqlite:///{elsewhere / 'cat.db'}"
    assert config.catalog.warehouse == f"file://{elsewhere / 'wh'}"
    assert config.compactor.checkpoint_dir == str(elsewhere / "ckpt")
    monkeypatch.delenv("STREAMBERG_INGEST__STATE_DIR")
    assert load_config(good_config).ingest.state_dir == str(good_config.parent / "state")  # the file's: its folder


def test_a_worker_rebuilds_the_drivers_config_validated_and_untouched_by_its_environment(
        good_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flink and Spark workers get the driver's config as data (dump_config). They rebuild every
    section through the same validators, and their own environment changes nothing."""
    from streamberg.common.config import config_from_dump, dump_config

    config = load_config(good_config)
    monkeypatch.setenv("STREAMBERG_KAFKA__TOPIC", "elsewhere")
    monkeypatch.setenv("STREAMBERG_MONITORING__METRICS_PORT", "1")
    rebuilt = config_from_dump(dump_config(config))
    assert rebuilt == config and type(rebuilt) is type(config)
    damaged = dump_config(config)
    damaged["maintenance"]["orphan"] = {"safety_age_seconds": 1}  # below the floor: refused again
    with pytest.raises(ConfigError, match="maintenance.orphan.safety_age_seconds"):
        config_from_dump(damaged)


def test_a_route_keeps_its_tables_tails_alone(tmp_path: Path) -> None:
    """keep_tail per route: the tables read fresh keep their tail, the rest of the fleet not
    (defaults.ingest.keep_tail is every route's unless it says otherwise)."""
    import yaml

    from streamberg.common.config import load_fleet
    from streamberg.common.config.loading import config_from_dump

    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "tables": [{"identifier": "shop.orders", "topics": ["orders"], "schema": "infer", "keep_tail": True},
                   {"identifier": "raw.{topic}", "topic_pattern": "ev\\..*", "schema": "infer"}]}))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    kept = [config_from_dump(fleet.document(route, topic)).ingest.keep_tail
            for route, topic in ((fleet.tables[0], "orders"), (fleet.tables[1], "ev.a"))]
    assert kept == [True, False]


def test_a_config_of_one_table_is_a_config_of_one_route_with_its_settings_as_set(
        good_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_tables, the one root loader: a config of one table is one route whose table keeps
    what the file and the environment set (the origins `status` shows), rebuilt whole from its
    dump where the object was (a worker's); a config of many has no one table."""
    from streamberg.common.config import FleetConfig, load_tables, one_table

    monkeypatch.setenv("STREAMBERG_COMPACTOR__MIN_FILES", "7")
    alone = load_config(good_config)
    fleet = load_tables(good_config)
    one = one_table(fleet)
    assert not fleet.many and one is not None and [r.identifier for r in fleet.tables] == [alone.table.identifier]
    assert one == alone and one.compactor.min_files == 7
    assert one.model_fields_set == alone.model_fields_set
    assert one.compactor.model_fields_set == alone.compactor.model_fields_set  # min_files set, the rest defaults
    rebuilt = one_table(FleetConfig.model_validate(fleet.model_dump()))
    assert rebuilt is not None and rebuilt.table.identifier == alone.table.identifier
    assert rebuilt.kafka.topic == alone.kafka.topic and rebuilt.compactor.min_files == 7
    many = tmp_path / "many.yaml"
    many.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": "127.0.0.1:9092"},
                                    "catalog": {"uri": "sqlite:///c.db", "warehouse": "w"},
                                    "tables": [{"identifier": "a.{topic}", "topics": ["t1", "t2"],
                                                "schema": [{"name": "id", "type": "long"}]}]}))
    loaded = load_tables(many)
    assert loaded.many and one_table(loaded) is None and loaded.named_topics() == ["t1", "t2"]
