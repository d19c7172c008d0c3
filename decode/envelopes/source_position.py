"""A Debezium change event's position in its source, as the change log's `_source_seq`.

Of two changes of one key, the merge applies the one later in the source (docs/cdc.md#order).
Kafka's offsets order the changes of one partition only, and `source.ts_ms` is a clock with
millisecond ties, so the connector's own log position decides where the event carries one.
Each connector's position is the tuple of non-negative integers below, compared left to
right and written as ordered text (table_meta/changelog.encode_sequence):

| `source.connector` | sequence | why these fields |
|---|---|---|
| postgresql | `sequence`: [last committed LSN, LSN] | the LSN alone interleaves transactions; the last commit before the change orders them (Debezium's own `sequence`, since 1.4) |
| mysql | binlog file number, `pos`, `row` | the binlog is in commit order |
| sqlserver | `commit_lsn`, `change_lsn`, `event_serial_no` | the commit orders transactions, the change LSN and serial number the changes inside one |
| db2 | `commit_lsn`, `change_lsn` | as SQL Server |
| oracle | `commit_scn`, `scn` | as SQL Server |
| mongodb | `ts_ms`, `ord` | the oplog's timestamp (seconds) and its increment |
| any other | `ts_ms` | no position known: the commit time |

A connector's event that lacks its fields (or holds a value that is no position) has no
sequence: the merge then orders it by its Kafka offset within its partition. Nothing here
refuses an event; a position is a hint the merge uses when it is there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from streamberg.table_meta.changelog import encode_digits, encode_sequence

_FILE_NUMBER = re.compile(r"\.(\d{1,18})$")
_HEX_LSN = re.compile(r"[0-9A-Fa-f]{1,32}(?::[0-9A-Fa-f]{1,32}){0,3}")
_MAX_PART = 2**128


# Every event's position is read in the ingest's per-record loop: the common types (what a
# JSON or Avro reader gives) are tested by identity first, the general case after.
def _number(value: Any) -> int | None:
    """A non-negative integer from a number or its decimal text."""
    kind = type(value)
    if kind is int:
        return value if 0 <= value < _MAX_PART else None
    if kind is str:
        return int(value) if 0 < len(value) <= 40 and value.isascii() and value.isdigit() else None
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
    if type(value) is str and len(value) <= 512:  # one binlog file holds many events: its number is read once
        found = _FILE_NUMBERS.get(value, _UNSEEN)
        if found is _UNSEEN:
            found = _binlog_file_number(value)
            if len(_FILE_NUMBERS) >= _MEMO_SIZE:
                _FILE_NUMBERS.clear()
            _FILE_NUMBERS[value] = found
        return found  # type: ignore[return-value]
    return _binlog_file_number(value)


def _binlog_file_number(value: Any) -> int | None:
    match = _FILE_NUMBER.search(value) if isinstance(value, str) and len(value) <= 512 else None
    return int(match.group(1)) if match else None


_UNSEEN = object()
_MEMO_SIZE = 1024  # binlog files (and server, file pairs) remembered; forgotten all at once past it
_FILE_NUMBERS: dict[str, int | None] = {}
_IDENTITIES: dict[tuple[Any, Any], str | None] = {}


def _json_list(text: str) -> Any:
    """JSON text as the standard library reads it: orjson first (a fifth of the time) where it
    gives the same answer, a list without floats; the standard library for the rest (orjson
    reads an integer past 64 bits as a float, and refuses NaN and lone surrogates)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if type(value) is list and not any(type(item) is float for item in value):
        return value
    try:
        return json.loads(text)
    except ValueError:
        return None


def _postgres(source: Mapping[str, Any]) -> tuple[int | None, ...]:
    raw = source.get("sequence")
    pair = _json_list(raw) if isinstance(raw, str) and len(raw) <= 200 else None
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


def source_identity(source: Any) -> str | None:
    """Which source a position belongs to, where a connector can say (None: it cannot):
    MySQL's server id and binlog base name (`mysql-bin` of `mysql-bin.000003`). A failover to
    another server, or a binlog renamed, starts positions over: the merge then opens a new
    source epoch by itself (table_meta/source_epochs.py). A RESET MASTER, or a PostgreSQL
    restored into a new cluster, keeps its name: an operator declares that epoch."""
    if (type(source) is not dict and not isinstance(source, Mapping)) or source.get("connector") != "mysql":
        return None
    server_id, file = source.get("server_id"), source.get("file")
    key = (server_id, file)
    # Hashable, read the same each time, and small (a hostile name is not kept).
    small_id = (type(server_id) is int and 0 <= server_id < 2**64) or (type(server_id) is str and len(server_id) <= 64)
    if small_id and type(file) is str and len(file) <= 512:
        found = _IDENTITIES.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = _identity(server_id, file)
            if len(_IDENTITIES) >= _MEMO_SIZE:
                _IDENTITIES.clear()
            _IDENTITIES[key] = found
        return found  # type: ignore[return-value]
    return _identity(server_id, file)


def _identity(server_id: Any, file: Any) -> str | None:
    server = _number(server_id)
    match = _PREFIX.match(file) if isinstance(file, str) else None
    if server is None or match is None:
        return None
    return f"mysql:{server}:{match.group(1)}"


# PostgreSQL's `sequence` as Debezium writes it, numbers without leading zeros (which the
# general path reads as the same number written shorter): read by one match, no JSON parse.
_WS = "[ \t\n\r]*"  # JSON's whitespace, no other
_PG_SEQUENCE = re.compile(rf'\[{_WS}(?:null|"(0|[1-9][0-9]{{0,37}})"){_WS},{_WS}"(0|[1-9][0-9]{{0,37}})"{_WS}\]')


def source_sequence(source: Any) -> str | None:
    """The ordered text of a Debezium `source` block's position; None without one."""
    if type(source) is not dict and not isinstance(source, Mapping):
        return None
    connector = source.get("connector")
    read = _CONNECTORS.get(connector) if type(connector) is str or isinstance(connector, str) else None
    # Fast paths for what connectors write (called for every change event), each giving what
    # the general path below gives (tests/cdc/test_source_position.py compares them):
    if read is None:  # no position known: the commit time, one number
        ts = source.get("ts_ms")
        if type(ts) is int and 0 <= ts < _MAX_PART:
            return encode_digits(str(ts))
    elif connector == "postgresql":
        raw = source.get("sequence")
        match = _PG_SEQUENCE.fullmatch(raw) if type(raw) is str and len(raw) <= 200 else None
        if match is not None:
            last, lsn = match.group(1) or "0", match.group(2)
            return encode_digits(last, lsn)
    parts = read(source) if read is not None else (_number(source.get("ts_ms")),)
    if None in parts:
        return None
    return encode_sequence(*parts)  # type: ignore[arg-type]  # no None left

