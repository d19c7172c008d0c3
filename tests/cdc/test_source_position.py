"""Source positions (decode/envelopes/source_position.py) against their first,
plain version: the per-record fast paths (type tests before isinstance, orjson before the
standard library, binlog names remembered) must read every `source` block as it did, for
any value a connector, a hostile producer or a schema registry can put there.

The reference below is that version as it stood (commit e5fc8f7), kept here as the
specification of the rules; the product's functions are compared with it on generated
blocks, each read twice (the second time through the remembered names).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamberg.decode.envelopes.source_position import source_identity, source_sequence
from streamberg.table_meta.changelog import SEQUENCE_DIGITS_MAX, encode_sequence


def reference_encode(*parts: Any) -> str | None:
    out = []
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            return None
        digits = str(part)
        if len(digits) > SEQUENCE_DIGITS_MAX:
            return None
        out.append(f"{len(digits):02d}{digits}")
    return "".join(out) if out else None


_FILE_NUMBER = re.compile(r"\.(\d{1,18})$")
_HEX_LSN = re.compile(r"[0-9A-Fa-f]{1,32}(?::[0-9A-Fa-f]{1,32}){0,3}")
_MAX_PART = 2**128


def _number(value: Any) -> int | None:
    """A non-negative integer from a number or its decimal text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < _MAX_PART else None
    if isinstance(value, str) and 0 < len(value) <= 40 and value.isascii() and value.isdigit():
        return int(value)
    return None


def _hex_lsn(value: Any) -> int | None:
    """SQL Server's and Db2's LSN text ("00000027:00000758:0005"): its hexadecimal digits as
    one integer (the parts are fixed-width, so the joined digits keep the order)."""
    if isinstance(value, str) and _HEX_LSN.fullmatch(value):
        return int(value.replace(":", ""), 16)
    return None


def _binlog_file(value: Any) -> int | None:
    """mysql-bin.000003 -> 3 (the number grows with each new file)."""
    match = _FILE_NUMBER.search(value) if isinstance(value, str) and len(value) <= 512 else None
    return int(match.group(1)) if match else None


def _postgres(source: Mapping[str, Any]) -> tuple[int | None, ...]:
    raw = source.get("sequence")
    try:
        pair = json.loads(raw) if isinstance(raw, str) and len(raw) <= 200 else None
    except ValueError:
        pair = None
    if not isinstance(pair, list) or len(pair) != 2:
        return (None,)
    # The last commit is null before the connector's first commit: nothing was committed yet.
    return (0 if pair[0] is None else _number(pair[0]), _number(pair[1]))


_CONNECTORS: dict[str, Callable[[Mapping[str, Any]], tuple[int | None, ...]]] = {
    "postgresql": _postgres,
    "mysql": lambda s: (_binlog_file(s.get("file")), _number(s.get("pos")), _number(s.get("row", 0))),
    "sqlserver": lambda s: (_hex_lsn(s.get("commit_lsn")), _hex_lsn(s.get("change_lsn")) or 0,
                            _number(s.get("event_serial_no", 0))),
    "db2": lambda s: (_hex_lsn(s.get("commit_lsn")), _hex_lsn(s.get("change_lsn")) or 0),
    "oracle": lambda s: (_number(s.get("commit_scn")), _number(s.get("scn"))),
    "mongodb": lambda s: (_number(s.get("ts_ms")), _number(s.get("ord"))),
}


_PREFIX = re.compile(r"^(.{1,200})\.\d{1,18}$")


def reference_identity(source: Any) -> str | None:
    """Which source a position belongs to, where a connector can say (None: it cannot):
    MySQL's server id and binlog base name (`mysql-bin` of `mysql-bin.000003`). A failover to
    another server, or a binlog renamed, starts positions over: the merge then opens a new
    source epoch by itself (table_meta/source_epochs.py). A RESET MASTER, or a PostgreSQL
    restored into a new cluster, keeps its name: an operator declares that epoch."""
    if not isinstance(source, Mapping) or source.get("connector") != "mysql":
        return None
    server, file = _number(source.get("server_id")), source.get("file")
    match = _PREFIX.match(file) if isinstance(file, str) else None
    if server is None or match is None:
        return None
    return f"mysql:{server}:{match.group(1)}"


def reference_sequence(source: Any) -> str | None:
    """The ordered text of a Debezium `source` block's position; None without one."""
    if not isinstance(source, Mapping):
        return None
    connector = source.get("connector")
    read = _CONNECTORS.get(connector) if isinstance(connector, str) else None
    parts = read(source) if read is not None else (_number(source.get("ts_ms")),)
    if any(p is None for p in parts):
        return None
    return reference_encode(*parts)



_numbers = st.one_of(st.integers(-5, 2**70), st.integers(2**127, 2**129), st.booleans(), st.none(),
                     st.floats(allow_nan=True), st.from_regex(r"[0-9]{1,45}", fullmatch=True),
                     st.sampled_from(["", "-1", "１２", "0x10", " 7", "12a"]))
_texts = st.one_of(
    st.from_regex(r"[0-9A-Fa-f]{1,34}(:[0-9A-Fa-f]{1,34}){0,4}", fullmatch=True),
    st.from_regex(r"[a-z-]{0,12}\.[0-9]{1,20}", fullmatch=True),
    st.from_regex(r'\[?[ \n\x0c]?(null|"[0-9]{1,41}")[ \t\r]?, ?"[0-9]{1,41}"[ \u00a0]?\]', fullmatch=True),  # PostgreSQL's sequence (and without its bracket)
    st.sampled_from(['["1","2"]', '[null,"5"]', "[1, 2]", '["1"]', "[1e400, 2]", "[NaN, 1]",
                     f'["{2**70}", "{2**80}"]', f"[{2**70}, {2**80}]", f"[null, {2**100}]", '["\\ud800", 1]', "{}", "[", "null", '[true, 1]',
                     "mysql-bin.000003", "x" * 600 + ".5"]),
    st.text(max_size=30))
_values = st.one_of(_numbers, _texts, st.lists(st.integers(0, 9), max_size=2))
_connectors = st.sampled_from(["postgresql", "mysql", "sqlserver", "db2", "oracle", "mongodb", "vitess", None, 5])
_fields = ("sequence", "file", "pos", "row", "server_id", "commit_lsn", "change_lsn", "event_serial_no",
           "commit_scn", "scn", "ts_ms", "ord")


@st.composite
def _sources(draw: Any) -> Any:
    if draw(st.integers(0, 20)) == 0:
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)))
    source: dict[str, Any] = {"connector": draw(_connectors)}
    for name in draw(st.lists(st.sampled_from(_fields), max_size=len(_fields), unique=True)):
        source[name] = draw(_values)
    return source


_SEQUENCES = ['["1","2"]', '[null,"5"]', "[1, 2]", "[1.0, 2]", "[1e400, 2]", "[NaN, 1]", f"[{2**70}, {2**80}]",
              f"[null, {2**100}]", f"[{2**130}, 1]", '["\\ud800", 1]', '["1", 2, 3]', "{}", "[", "null",
              '["0","0"]', '[null,"0"]', '["007","8"]', '["1","08"]', f'["{10**37}","{10**37 + 1}"]',
              f'["{2**128}","1"]', f'["{10**39}","{10**40}"]', '["1","2"] ', '["1",\n"2"]', '["1", "2"]', '[ "1" ,\t"2"\r]', '["1",\x0c"2"]', '["1","2","3"]']


@settings(max_examples=1500, deadline=None)
@given(_sources())
@example({"connector": "mysql", "server_id": 7, "file": "mysql-bin.000003", "pos": 4, "row": 0})
@example({"connector": "mysql", "server_id": True, "file": "mysql-bin.000003", "pos": 4})
@example({"connector": "mysql", "server_id": "7", "file": "x" * 600 + ".000003", "pos": 4})
@example({"connector": "sqlserver", "commit_lsn": "00000027:00000758:0005", "change_lsn": "0000:1"})
def test_a_source_block_reads_as_the_plain_rules_read_it(source: Any) -> None:
    for _ in range(2):  # the second read through what the first one remembered
        assert source_sequence(source) == reference_sequence(source)
        assert source_identity(source) == reference_identity(source)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 2**64), st.integers(10**98, 10**100), st.booleans()), max_size=4))
def test_a_sequence_encodes_as_before(parts: list[Any]) -> None:
    assert encode_sequence(*parts) == reference_encode(*parts)


def test_every_postgres_sequence_text_reads_as_before() -> None:
    for text in _SEQUENCES:
        source = {"connector": "postgresql", "sequence": text}
        assert source_sequence(source) == reference_sequence(source), text
