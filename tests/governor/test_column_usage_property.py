"""A property of the column lifecycle's statistics: whatever stream of scan reports arrives
(top-level names, leaves of structs, lists and maps, field ids, junk names, reports of
thousands of names), and whatever the schema does meanwhile (columns added, renamed), no
column read within the window, or present for less than a window, is ever called unused.

The test keeps its own account, by field id: when each column appeared and when any part of
it was last read under the names of that moment; the product's answer (table_meta/query_stats.
usage over the real fold of report lines) must never call unused what that account says was
read or too new. Hypothesis drives the streams."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import ListType, LongType, MapType, NestedField, StringType, StructType

from streamberg.table_meta.column_usage import ColumnFacts
from streamberg.table_meta.query_stats import fold, load, usage

DAY = 86400.0
WINDOW_DAYS = 30.0
START = 1_800_000_000.0


@dataclass
class Account:
    """The test's own view: top-level columns by id, each with its shape and history."""

    names: dict[int, str] = field(default_factory=dict)  # top id -> current name
    kind: dict[int, str] = field(default_factory=dict)  # top id -> plain | struct | list | map
    added: dict[int, float] = field(default_factory=dict)
    last_read: dict[int, float] = field(default_factory=dict)
    next_id: int = 1
    history: list[Schema] = field(default_factory=list)

    def add(self, kind: str, at: float) -> None:
        top = self.next_id
        self.next_id += 4  # room for its children's ids
        self.names[top], self.kind[top], self.added[top] = f"c{top}", kind, at

    def schema(self) -> Schema:
        fields = []
        for top, name in self.names.items():
            kind = self.kind[top]
            if kind == "struct":
                field_type = StructType(NestedField(top + 1, "a", StringType()), NestedField(top + 2, "b", LongType()))
            elif kind == "list":
                field_type = ListType(top + 1, StringType())
            elif kind == "map":
                field_type = MapType(top + 1, StringType(), top + 2, LongType())
            else:
                field_type = StringType()
            fields.append(NestedField(top, name, field_type))
        return Schema(*fields, schema_id=len(self.history))

    def leaves(self, top: int) -> list[tuple[str, int]]:
        """(name, id) of what a report may name for this column now."""
        name, kind = self.names[top], self.kind[top]
        if kind == "struct":
            return [(f"{name}.a", top + 1), (f"{name}.b", top + 2)]
        if kind == "list":
            return [(f"{name}.element", top + 1)]
        if kind == "map":
            return [(f"{name}.key", top + 1), (f"{name}.value", top + 2)]
        return [(name, top)]


read_step = st.tuples(st.just("read"), st.lists(st.integers(0, 50), min_size=1, max_size=4),
                      st.sampled_from(["name", "leaf", "id", "filter"]))
step = st.one_of(
    read_step, read_step, read_step,
    st.tuples(st.just("wait"), st.floats(0.5, 20.0)),
    st.tuples(st.just("add"), st.sampled_from(["plain", "struct", "list", "map"])),
    st.tuples(st.just("rename"), st.integers(0, 50)),
    st.tuples(st.just("junk"), st.integers(1, 5000)),
    st.just(("check",)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["plain", "struct", "list", "map"]), min_size=1, max_size=5),
       st.lists(step, min_size=1, max_size=40))
def test_no_column_read_within_the_window_is_ever_called_unused(kinds, steps) -> None:
    # The table and the collection began 40 days before: every check can call columns unused.
    account, now, renames = Account(), START - 40 * DAY, 0
    for kind in kinds:
        account.add(kind, now)
    account.history.append(account.schema())
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)

        def report(payload: dict) -> None:
            with (folder / "reports-t.jsonl").open("a") as out:
                out.write(json.dumps({"report-type": "scan-report",
                                      "report": {"table-name": "db.t", "metrics": {}, **payload}}) + "\n")
            fold(folder, "c", now=now)

        def facts() -> ColumnFacts:
            # Proof of a column's existence: a snapshot written since it was added (the test
            # commits one at each add), as ColumnFacts.of_table reads it from the metadata.
            return ColumnFacts.of_schemas("uuid-1", account.history[-1], account.history[:-1],
                                          appeared={top: at for top, at in account.added.items()}, loaded_at=now)

        report({"projected-field-names": []})  # collection starts with the table
        now = START
        for action in [*steps, ("check",)]:
            tops = list(account.names)
            if action[0] == "read":
                _, picks, how = action
                chosen = [tops[p % len(tops)] for p in picks]
                names, ids, terms = [], [], []
                for top in chosen:
                    leaf_name, leaf_id = account.leaves(top)[picks[0] % len(account.leaves(top))]
                    if how == "name":
                        names.append(account.names[top])
                    elif how == "leaf":
                        names.append(leaf_name)
                    elif how == "id":
                        ids.append(leaf_id)
                    else:
                        terms.append({"type": "eq", "term": leaf_name, "value": "x"})
                    account.last_read[top] = now
                payload: dict = {"projected-field-names": names, "projected-field-ids": ids}
                if terms:
                    payload["filter"] = terms[0] if len(terms) == 1 else {"type": "and", "left": terms[0],
                                                                           "right": terms[1]}
                    for extra in terms[2:]:  # a filter names at most two; the rest are projected
                        payload["projected-field-names"].append(extra["term"])
                report(payload)
            elif action[0] == "wait":
                now += action[1] * DAY
            elif action[0] == "add":
                account.add(action[1], now)
                account.history.append(account.schema())
            elif action[0] == "rename":
                top = tops[action[1] % len(tops)]
                renames += 1
                account.names[top] = f"r{renames}_{top}"
                account.history.append(account.schema())
            elif action[0] == "junk":
                report({"projected-field-names": [f"junk{i}" for i in range(action[1])],
                        "filter": {"type": "eq", "term": "nothing.here", "value": 1}})
            else:
                # As a status pass reads it (the statistics loaded once for many tables), then
                # alone: the same answer, what needed recording recorded either way.
                through_pass = usage(folder, "db.t", facts(), WINDOW_DAYS, now=now, loaded=load(folder))
                found = usage(folder, "db.t", facts(), WINDOW_DAYS, now=now)
                assert through_pass == found
                unused = found["unused_columns"] or []
                cutoff = now - WINDOW_DAYS * DAY
                by_name = {name: top for top, name in account.names.items()}
                for name in unused:
                    top = by_name[name]
                    assert account.last_read.get(top, -1.0) < cutoff, (name, "read within the window")
                    assert account.added[top] <= cutoff, (name, "not present for a whole window")
