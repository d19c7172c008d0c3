"""Hostile configuration files: each fails fast, in one line naming the key, exit 2, nothing written.

The corpus runs through `load_config` in-process (cheap: the whole corpus takes about a
second); a representative subset runs through the real `streamberg` command in a
subprocess, one per subcommand, to prove the exit code, the single stderr line, the absence
of a traceback and of secrets, and that no file or folder appeared.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamberg.common.config import MAX_CONFIG_BYTES, load_config
from streamberg.common.errors import ConfigError
from tests.helpers import EVENT_SCHEMA

# Values that must never appear in an error message.
SECRET = "hunter2-Zq9"
S3_SECRET = "s3-secret-Kx7"

BASE: dict[str, Any] = {
    "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "events", "consumer": {"sasl.password": SECRET}},
    "catalog": {"name": "c1", "uri": f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db", "warehouse": "warehouse",
                "properties": {"s3.secret-access-key": S3_SECRET, "s3.access-key-id": "AKIAEXAMPLEKEY"}},
    "table": {"identifier": "db.events", "schema": copy.deepcopy(EVENT_SCHEMA),
              "partition_spec": [{"source": "user_id", "transform": "bucket[4]"}]},
    "ingest": {"state_dir": "state", "parallelism": 2},
}


def doc(change: Callable[[dict[str, Any]], Any]) -> str:
    """The base document changed by `change`, as YAML text."""
    document = copy.deepcopy(BASE)
    change(document)
    return yaml.safe_dump(document, sort_keys=False)


def base_text() -> str:
    return yaml.safe_dump(BASE, sort_keys=False)


def field_index(name: str) -> int:
    return [f["name"] for f in BASE["table"]["schema"]].index(name)


@dataclass
class Case:
    expect: str  # a substring of the message: the key (or the file problem) it names
    text: str | bytes | None = None  # the file's content
    make: Callable[[Path], Path] | None = None  # or: makes the "file" itself (FIFO, folder, ...)
    env: dict[str, str] | None = None


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo.yaml")
    return tmp / "fifo.yaml"


def _folder(tmp: Path) -> Path:
    (tmp / "folder.yaml").mkdir()
    return tmp / "folder.yaml"


def _symlink_to_dev_zero(tmp: Path) -> Path:
    (tmp / "zero.yaml").symlink_to("/dev/zero")
    return tmp / "zero.yaml"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def _bad_field_name(name: str) -> Callable[[dict[str, Any]], None]:
    return _set(f"table.schema.{field_index('city')}.name", name)


CASES: dict[str, Case] = {
    # -- sections of the wrong shape --
    "section as a number": Case("compactor", doc(_set("compactor", 5))),
    "section as a string": Case("catalog", doc(_set("catalog", "oops"))),
    "section as a list": Case("ingest", doc(_set("ingest", [1, 2]))),
    "required section as a string": Case("kafka", doc(_set("kafka", "localhost"))),
    "document is a list": Case("must be a mapping of sections", "- kafka\n- table\n"),
    "empty file": Case("kafka: Field required", ""),
    # -- YAML that must not be taken as it parses --
    "non-string key at the top": Case("key 1 is not a string", base_text() + "1: x\n"),
    "non-string key in a section": Case("key True is not a string", doc(_set("ingest", {True: 5}))),
    "duplicate section": Case("duplicate key 'kafka'", base_text() + "kafka: {topic: other}\n"),
    "duplicate nested key": Case("duplicate key 'parallelism'",
                                 base_text().replace("  parallelism: 2\n", "  parallelism: 2\n  parallelism: 8\n")),
    "3000-deep brackets": Case("nested more than", "kafka: " + "[" * 3000 + "]" * 3000 + "\n"),
    "alias flood": Case("aliases", "a: &a [x, x]\n" + "".join(f"b{i}: &b{i} [*a, *a]\n" for i in range(120))),
    "integer of 5000 digits": Case("holds a value YAML cannot read", doc(_set("ingest", {})) + "x: " + "9" * 5000 + "\n"),
    "python object tag": Case("not valid YAML", base_text() + "x: !!python/object/apply:os.system ['true']\n"),
    "not UTF-8": Case("not UTF-8", base_text().encode() + b"# caf\xe9\n"),
    "too large": Case(f"larger than {MAX_CONFIG_BYTES} bytes", base_text() + "#" * MAX_CONFIG_BYTES + "\n"),
    # -- files that are not files --
    "/dev/zero": Case("is not a regular file", make=lambda tmp: Path("/dev/zero")),
    "symlink to /dev/zero": Case("is not a regular file", make=_symlink_to_dev_zero),
    "a FIFO": Case("is not a regular file", make=_fifo),
    "a folder": Case("is not a regular file", make=_folder),
    # -- numbers --
    "interval .inf": Case("ingest.commit_interval_seconds: must be a number > 0",
                          doc(_set("ingest.commit_interval_seconds", float("inf")))),
    "interval .nan": Case("ingest.commit_interval_seconds", doc(_set("ingest.commit_interval_seconds", float("nan")))),
    "interval 1.0e+400": Case("compactor.trigger_interval_seconds",
                              base_text() + "compactor: {trigger_interval_seconds: 1.0e+400}\n"),
    "parallelism 10^15": Case("ingest.parallelism: must be an integer between 1 and 256",
                              doc(_set("ingest.parallelism", 10**15))),
    "parallelism true": Case("ingest.parallelism", doc(_set("ingest.parallelism", True))),
    "parallelism 2.5": Case("ingest.parallelism", doc(_set("ingest.parallelism", 2.5))),
    "target file size 10^29": Case("table.target_file_size_bytes", doc(_set("table.target_file_size_bytes", 10**29))),
    "negative delay": Case("compactor.max_delay_seconds", doc(_set("compactor", {"max_delay_seconds": -1}))),
    "index bits 21": Case("compactor.index_bits", doc(_set("compactor", {"index_bits": 21}))),
    "metrics port true": Case("monitoring.metrics_port", doc(_set("monitoring", {"metrics_port": True}))),
    "bool given as 1": Case("monitoring.read_last_batch: must be true or false",
                            doc(_set("monitoring", {"read_last_batch": 1}))),
    "bool given as 'yes'": Case("maintenance.expire.enabled", doc(_set("maintenance", {"expire": {"enabled": "yes"}}))),
    "schema required as 'yes'": Case(f"table.schema.{field_index('city')}.required",
                                     doc(_set(f"table.schema.{field_index('city')}.required", "yes"))),
    "bucket[99999999999999999999]": Case("table.partition_spec.0.transform",
                                         doc(_set("table.partition_spec.0.transform", "bucket[99999999999999999999]"))),
    "bucket[2^31]": Case("table.partition_spec.0.transform", doc(_set("table.partition_spec.0.transform", "bucket[2147483648]"))),
    "decimal(99,120)": Case(f"table.schema.{field_index('amount')}.type",
                            doc(_set(f"table.schema.{field_index('amount')}.type", "decimal(99,120)"))),
    "decimal scale above precision": Case(f"table.schema.{field_index('amount')}.type",
                                          doc(_set(f"table.schema.{field_index('amount')}.type", "decimal(10,11)"))),
    # -- identifiers --
    "Cyrillic look-alike table": Case("table.identifier: must be namespace.table",
                                      doc(_set("table.identifier", "d\u0435mo.events"))),
    "5000-character table name": Case("table.identifier", doc(_set("table.identifier", "db." + "e" * 5000))),
    "field name ../../x": Case(f"table.schema.{field_index('city')}.name", doc(_bad_field_name("../../x"))),
    "5000-character field name": Case(f"table.schema.{field_index('city')}.name", doc(_bad_field_name("c" * 5000))),
    "catalog name with quotes": Case("catalog.name", doc(_set("catalog.name", "x`; DROP TABLE t; --'"))),
    "dead-letter table is the main table": Case("dead_letter.table: must differ",
                                                doc(_set("dead_letter", {"table": "DB.Events"}))),
    "topic with a slash": Case("kafka.topic", doc(_set("kafka.topic", "../events"))),
    "topic '..'": Case("kafka.topic", doc(_set("kafka.topic", ".."))),
    "clustering column with a space": Case("compactor.columns.0", doc(_set("compactor", {"columns": ["user id"]}))),
    "retention column as a path": Case("maintenance.retention.column",
                                       doc(_set("maintenance", {"retention": {"column": "../ts", "days": 3}}))),
    "group id with a newline": Case("kafka.group_id", doc(_set("kafka.group_id", "g\nsecond line"))),
    "NUL in the state dir": Case("ingest.state_dir", doc(_set("ingest.state_dir", "state\x00/etc"))),
    "partition spec as a mapping": Case("table.partition_spec: must be a list",
                                        doc(_set("table.partition_spec", {"source": "ts", "transform": "day"}))),
    "schema entry as a string": Case("table.schema.0: must be a mapping of keys", doc(_set("table.schema.0", "id"))),
    "5000-character unknown key": Case("Extra inputs are not permitted", doc(_set("ingest", {"k" * 5000: 1}))),
    "unknown key with a newline": Case("ingest.a\\nb: Extra inputs are not permitted", doc(_set("ingest", {"a\nb": 1}))),
    "5000-character type": Case(f"table.schema.{field_index('city')}.type: unknown type",
                                doc(_set(f"table.schema.{field_index('city')}.type", "t" * 5000))),
    "too many consumer settings": Case("kafka.consumer", doc(_set("kafka.consumer", {f"k{i}": "v" for i in range(300)}))),
    "home of an unknown user": Case("catalog.warehouse: cannot resolve the path",
                                    doc(_set("catalog.warehouse", "~no_such_user_x9/warehouse"))),
    "zero-width space in a path": Case("ingest.state_dir: must be a string of 1 to 4096 printable characters",
                                       doc(_set("ingest.state_dir", "sta\u200bte"))),
    # -- secrets must not be echoed --
    "catalog uri without a scheme": Case("catalog.uri", doc(_set("catalog.uri", f"{SECRET}-no-scheme"))),
    "catalog property not a string": Case("catalog.properties.s3.secret-access-key",
                                          doc(_set("catalog.properties", {"s3.secret-access-key": [SECRET]}))),
    "consumer setting a mapping": Case("kafka.consumer.sasl.password",
                                       doc(_set("kafka.consumer", {"sasl.password": {"p": SECRET}}))),
    # -- environment overrides --
    "bad JSON in a section override": Case("STREAMBERG_KAFKA: not valid JSON", base_text(),
                                           env={"STREAMBERG_KAFKA": "{not json"}),
    "bad JSON in a key override": Case("STREAMBERG_CATALOG__PROPERTIES: not valid JSON", base_text(),
                                       env={"STREAMBERG_CATALOG__PROPERTIES": f'{{"s3.secret-access-key": "{S3_SECRET}"'}),
    "boolean override of an integer": Case("ingest.parallelism", base_text(), env={"STREAMBERG_INGEST__PARALLELISM": "true"}),
    "inf override": Case("ingest.commit_interval_seconds", base_text(),
                         env={"STREAMBERG_INGEST__COMMIT_INTERVAL_SECONDS": "inf"}),
    "override of the uri without a scheme": Case("catalog.uri", base_text(), env={"STREAMBERG_CATALOG__URI": SECRET}),
}


def _materialise(case: Case, tmp: Path) -> Path:
    if case.make is not None:
        return case.make(tmp)
    path = tmp / "streamberg.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text or "")
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _check_message(message: str, expect: str) -> None:
    assert expect in message, message
    assert "\n" not in message.strip(), f"not one line: {message!r}"
    assert SECRET not in message and S3_SECRET not in message, message
    assert len(message) < 1000, f"{len(message)} characters"


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


def test_the_base_document_is_valid(tmp_path: Path) -> None:
    # Otherwise every case below could fail for a reason of the base, not its own.
    (tmp_path / "streamberg.yaml").write_text(base_text())
    config = load_config(tmp_path / "streamberg.yaml")
    assert config.table.identifier == "db.events"
    assert _tree(tmp_path) == ["streamberg.yaml"]


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_config_is_refused_in_one_line_naming_the_key(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    for key, value in (case.env or {}).items():
        monkeypatch.setenv(key, value)
    path = _materialise(case, tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    _check_message(str(error.value), case.expect)
    assert _tree(tmp_path) == before


# One hostile config per subcommand, through the real command line.
CLI_CASES = [
    (("status", "--json"), "section as a string"),
    (("metrics", "--once"), "parallelism true"),
    (("table",), "Cyrillic look-alike table"),
    (("table", "--json"), "catalog uri without a scheme"),
    (("ingest", "--max-records", "1"), "dead-letter table is the main table"),
    (("compact", "--once"), "catalog name with quotes"),
    (("maintain", "--once"), "duplicate nested key"),
    (("produce", "--count", "1"), "3000-deep brackets"),
    (("replay", "--dead-letters"), "field name ../../x"),
    (("status",), "bad JSON in a section override"),
    (("table",), "/dev/zero"),
    (("ingest", "--max-records", "1"), "a FIFO"),
]


@pytest.mark.parametrize(("args", "name"), CLI_CASES, ids=[f"{a[0]}-{n}" for a, n in CLI_CASES])
def test_cli_exits_2_with_one_line_and_writes_nothing(args: tuple[str, ...], name: str, tmp_path: Path) -> None:
    case = CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    path = _materialise(case, work)
    before = _tree(work)
    exe = Path(sys.executable).parent / "streamberg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMBERG_")}
    env.update({"STREAMBERG_LOG_FORMAT": "json", **(case.env or {})})
    # cwd is the config's folder: relative defaults (.streamberg/...) would land there.
    proc = subprocess.run([str(exe), args[0], "--config", str(path), *args[1:]], capture_output=True, text=True,
                          timeout=120, cwd=work, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    _check_message(lines[0], case.expect)
    assert _tree(work) == before
