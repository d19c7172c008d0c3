"""The floors hold: components import only common/, common/ imports no component.

Read from the source with `ast` (every import statement, at any depth, lazy ones included).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("ingest", "compactor", "maintenance", "merge", "monitoring", "governor")
PRODUCT = ("common", "table_meta", "decode", "ingest", "compactor", "maintenance", "merge", "monitoring", "governor",
           "supervisor", "cli", "fresh")
SHARED = ("common", "table_meta")  # the floors every component stands on
# Besides itself, what each folder may import from streamberg.
# decode/ is a floor of its own above common/: the ingest writes what it decodes and a fresh
# read decodes a table's tail with the same decoders (what it would write is what a fresh read
# returns), so both stand on it and neither imports the other.
# table_meta/ (what streamberg keeps about each table: the records in its metadata and the one
# object per table) stands on common/'s infrastructure, which never imports it.
ALLOWED = {**{c: {"common", "table_meta"} for c in COMPONENTS}, "common": set(), "table_meta": {"common"},
           "supervisor": {"common", "table_meta"}, "decode": {"common", "table_meta"},
           "ingest": {"common", "table_meta", "decode"}, "fresh": {"common", "table_meta", "decode"}}


def _streamberg_imports(path: Path) -> set[str]:
    """Second-level package of every `streamberg.X...` import in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamberg" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_the_floors_below(folder: str) -> None:
    wrong = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = _streamberg_imports(path) - ALLOWED[folder] - {folder}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"imports across the floors: {wrong}"


def test_the_check_sees_imports() -> None:
    """The reader above finds lazy imports too (else the test above proves nothing)."""
    assert _streamberg_imports(ROOT / "cli" / "run.py") >= {"common", "monitoring", "supervisor"}


# -- each component reads its own section ---------------------------------------------------------

# Sections of StreambergConfig a component's code may read (`config.<section>`): its own plus
# the shared ones. Monitoring reports backlog by the compactor's own rules, so it reads them.
SECTIONS = {
    "ingest": {"kafka", "catalog", "table", "ingest", "dead_letter"},
    "compactor": {"catalog", "table", "compactor"},
    "maintenance": {"catalog", "table", "kafka", "maintenance", "compactor"},  # compactor: its Spark settings
    "monitoring": {"kafka", "catalog", "table", "ingest", "dead_letter", "compactor", "monitoring", "merge"},
    "merge": {"catalog", "table", "kafka", "merge"},  # kafka: the envelope says whether there is a change log
}
# Where the whole configuration is taken apart: a component's services are given their
# section and the TableTarget, not the whole StreambergConfig.
# An executor (table_meta/keeping.py) is the app's entry for the governor: it composes as app.py does.
COMPOSERS = {"compactor": {"app.py", "executor.py"}, "maintenance": {"app.py", "executor.py", "columns.py"},
             "merge": {"app.py", "executor.py"}}


def _sections_read(path: Path) -> set[str]:
    from streamberg.common.config import StreambergConfig

    sections = set(StreambergConfig.model_fields) - {"config_path"}
    return {node.attr for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.Attribute) and node.attr in sections
            and isinstance(node.value, ast.Name) and node.value.id == "config"}


@pytest.mark.parametrize("component", sorted(SECTIONS))
def test_component_reads_only_its_sections(component: str) -> None:
    wrong = {str(p.relative_to(ROOT)): sorted(_sections_read(p) - SECTIONS[component])
             for p in sorted((ROOT / component).rglob("*.py"))}
    assert not {k: v for k, v in wrong.items() if v}


@pytest.mark.parametrize("component", sorted(COMPOSERS))
def test_services_are_given_their_section_not_the_whole_config(component: str) -> None:
    whole = [str(p.relative_to(ROOT)) for p in sorted((ROOT / component).rglob("*.py"))
             if p.name not in COMPOSERS[component] and "StreambergConfig" in p.read_text()]
    assert not whole, f"modules taking the whole StreambergConfig: {whole}"


def test_the_section_check_sees_reads() -> None:
    assert _sections_read(ROOT / "compactor" / "app.py") >= {"compactor", "catalog", "table"}


# The compactor's planning (runs, size tiers, sealing, group sizes) lives in compactor/; the
# shared floor holds only what other components read too (files, pending, when a partition
# is due). Names that would mean planning crept back down:
PLANNING_NAMES = {"PlanningRules", "Run", "RunLayout", "RunCandidate", "merge_factor", "seal_after_commits",
                  "seal_after_seconds", "max_group_bytes", "tiered_merge"}


def _names_defined_or_read(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return names | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def test_planning_lives_in_the_compactor() -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(_names_defined_or_read(p) & PLANNING_NAMES)
                 for floor in SHARED for p in (ROOT / floor).rglob("*.py") if "config" not in p.parts}
    assert not {p: n for p, n in offenders.items() if n}, offenders
    assert PLANNING_NAMES & _names_defined_or_read(ROOT / "compactor" / "runs.py")  # the check sees names


# What only the ingest defines: the dead-letter table's schema and creation, and its run
# identity (which lives in IngestTarget, built from the config, not on the shared config).
INGEST_ONLY_DEFINITIONS = {"DEAD_LETTER_SCHEMA", "ensure_dead_letter_table", "open_tables", "dead_letter_rows"}


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return names | {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}


def test_common_holds_no_ingest_only_names() -> None:
    from streamberg.common.config import StreambergConfig

    offenders = {str(p.relative_to(ROOT)): sorted(_defined(p) & INGEST_ONLY_DEFINITIONS)
                 for floor in SHARED for p in (ROOT / floor).rglob("*.py")}
    assert not {p: n for p, n in offenders.items() if n}, offenders
    assert _defined(ROOT / "ingest" / "dead_letters.py") >= INGEST_ONLY_DEFINITIONS  # the check sees definitions
    shared = set(StreambergConfig.model_fields) | {n for n in dir(StreambergConfig) if not n.startswith("_")}
    assert not shared & {"job_id", "consumer_group", "dead_letter_table", "state_dir"}
    assert "ingest_target" in shared


def _ingest_imports(path: Path, prefix: str = "streamberg.ingest.") -> set[str]:
    """The `prefix...` modules a file imports, at any depth (lazy ones included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(prefix)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
            found.add(node.module)
    return found


def _module(path: Path) -> str:
    return "streamberg." + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_local_flink_plumbing_is_a_wing_without_circles() -> None:
    """ingest/local/ (the MiniCluster, the gateway JVM, the fork server) never imports the
    ingest's domain, and no two ingest modules import each other, even lazily."""
    graph = {_module(p): _ingest_imports(p) for p in (ROOT / "ingest").rglob("*.py")}
    local = {m: deps for m, deps in graph.items() if m.startswith("streamberg.ingest.local.")}
    assert local and "streamberg.ingest.local.gateway" in local  # the check sees the wing
    assert not {m: sorted(d for d in deps if not d.startswith("streamberg.ingest.local"))
                for m, deps in local.items() if any(not d.startswith("streamberg.ingest.local") for d in deps)}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for dep in graph.get(start, ()):
            if dep == goal or (dep not in seen and (seen.add(dep) or reaches(dep, goal, seen))):
                return True
        return False

    circles = sorted(m for m in graph if reaches(m, m, set()))
    assert not circles, circles


# -- decoding has one home (decode/) ---------------------------------------------------------

def _compares_attribute(path: Path, attribute: str) -> list[int]:
    """Lines where `<x>.<attribute>` is compared with a literal (== != in, either side)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == attribute for s in sides) \
                    and any(isinstance(s, (ast.Constant, ast.Tuple, ast.Set, ast.List)) for s in sides):
                lines.append(node.lineno)
    return lines


def test_decoding_has_one_home() -> None:
    """The value format is decided in decode/formats.py alone, the envelope in
    decode/envelopes/ and table_meta/changelog.has_changelog; the registry and schema
    conversions live under decode/, the sample producer in cli/."""
    for moved in ("avro_schema.py", "protobuf_schema.py", "registry.py", "sample_events.py"):
        assert not (ROOT / "common" / moved).exists(), f"common/{moved} is ingest-only: it lives in decode/"
    product = [p for folder in ("common", "table_meta", "ingest", "compactor", "maintenance", "merge", "monitoring",
                                "supervisor") for p in (ROOT / folder).rglob("*.py")]
    on_format = {str(p.relative_to(ROOT)): _compares_attribute(p, "value_format") for p in product}
    # The configuration validates what it is given at load (sections: a registry for framed
    # formats; model: what an envelope reads), as a contract; the choice is the registry's.
    config_checks = {"common/config/sections.py", "common/config/model.py"}
    assert not {p: n for p, n in on_format.items() if n and p not in config_checks}, on_format
    on_envelope = {str(p.relative_to(ROOT)): _compares_attribute(p, "envelope") for p in product}
    # has_changelog; the config's own checks (a route by a record field reads plain rows)
    allowed = {"table_meta/changelog.py", "common/config/model.py", "common/config/fleet.py"}
    assert not {p: n for p, n in on_envelope.items() if n and p not in allowed}, on_envelope
    assert _compares_attribute(ROOT / "table_meta" / "changelog.py", "envelope")  # the check sees comparisons
    decoders = {"streamberg.decode.json_decode", "streamberg.decode.avro_decode",
                "streamberg.decode.protobuf_decode"}
    outside = {str(p.relative_to(ROOT)): sorted(_ingest_imports(p, "streamberg.decode.") & decoders)
               for folder in ("ingest", "fresh") for p in (ROOT / folder).rglob("*.py")}
    assert not {p: m for p, m in outside.items() if m}, f"decoders chosen outside decode: {outside}"
    assert _ingest_imports(ROOT / "decode" / "formats.py", "streamberg.decode.") & decoders  # the check sees them


# -- one registry of catalog kinds, one set of tables per config ----------------------------------

_KINDS = {"sql", "rest", "glue", "hive"}


def _compares_with_kind(path: Path) -> list[int]:
    """Lines where something is compared with a catalog kind's name (`x.type == "rest"`,
    `kind in ("glue", "hive")`, `catalog.get("type") == "sql"`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            literals = {n.value for s in [node.left, *node.comparators] for n in ast.walk(s)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if literals & _KINDS:
                lines.append(node.lineno)
    return lines


def test_catalog_kinds_are_decided_in_one_registry() -> None:
    """common/catalog_kinds.py is the one place a catalog's kind is asked (the config model's
    own validators excepted): a new kind is one entry there."""
    product = [p for folder in PRODUCT if folder not in ("decode", "fresh") for p in (ROOT / folder).rglob("*.py")]
    allowed = {"common/catalog_kinds.py", "common/config/table.py"}
    found = {str(p.relative_to(ROOT)): _compares_with_kind(p) for p in product}
    assert not {p: n for p, n in found.items() if n and p not in allowed}, found
    assert _compares_with_kind(ROOT / "common" / "config" / "table.py")  # the check sees comparisons



def test_one_committer_kind() -> None:
    """A table of one config is a fleet of one: no committer knows whether it is one of many."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "ingest").rglob("*.py") if "fleet_member" in p.read_text()]
    assert not offenders, offenders


def test_every_module_is_named_in_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for folder in PRODUCT for p in sorted((ROOT / folder).rglob("*.py"))
               if p.name != "__init__.py" and f"`{p.stem}`" not in doc]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"


def test_no_module_past_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for folder in PRODUCT for p in (ROOT / folder).rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


# -- one owner of resources (common/runtime.py) -------------------------------------------------------

def _product_modules() -> list[tuple[str, Path]]:
    """(path from the root, path) of every module of the product."""
    return [(str(path.relative_to(ROOT)), path) for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))]


def _findings(find: Callable[[Path], list[str]], allowed: Collection[str], join: str = ":") -> list[str]:
    """`<module><join><finding>` of what `find` finds in the product, but for what `allowed`
    names (a whole module, or one finding of it)."""
    found = []
    for relative, path in _product_modules():
        if relative not in allowed:
            found += [entry for item in find(path) if (entry := f"{relative}{join}{item}") not in allowed]
    return found

# Module-level containers filled while the process runs, each with why it is no resource:
# everything that holds a connection, a client or a session lives in the Runtime.
KEPT_AT_MODULE_LEVEL = {
    "common/runtime.py": "the one owner",
    "common/redact.py:_literals": "the secrets to mask, registered by load_config: strings",
    "decode/envelopes/source_position.py:_FILE_NUMBERS": "binlog file names parsed: a bounded memo of strings",
    "decode/envelopes/source_position.py:_IDENTITIES": "server identities parsed: a bounded memo of strings",
    "ingest/local/gateway_auth.py:gateway_token (memoized)": "the driver's gateway token: one string, the JVM inherits it",
}
_EMPTY_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary", "deque"}


def _module_level_caches(path: Path) -> list[str]:
    """Names bound at module level to an empty container (a cache filled at run time), and
    functions memoized by functools (a value kept for the process's life)."""
    found = []
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                name = ast.unparse(decorator)
                if any(k in name for k in ("functools.cache", "lru_cache", "cached_property")) or name == "cache":
                    found.append(f"{node.name} (memoized)")
            continue
        empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                 and not getattr(value, "elts", None)) or \
            (isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in _EMPTY_CALLS and not value.args)
        if empty:
            found.extend(ast.unparse(t) for t in targets)
    return found




# -- one object per table holds its settings (table_meta/table_runtime.py) -------------------------------

PARSERS = {"policy_of", "policy_for", "table_settings", "effective"}
PARSED_IN = {"table_meta/policy.py", "table_meta/table_runtime.py"}


def _policy_parsers_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "streamberg.table_meta.policy":
            found |= {alias.name for alias in node.names} & PARSERS
        elif isinstance(node, ast.Attribute) and node.attr in PARSERS and ast.unparse(node.value).endswith("policy"):
            found.add(node.attr)
    return found


def test_policy_is_parsed_only_by_the_table_runtime() -> None:
    """A table's `streamberg.*` settings are parsed in one place (TableRuntime.of) and read from
    there by every component, the governor and status: two parses once disagreed (`auto`
    clustering protected a column literally named "auto")."""
    wrong = {}
    for relative, path in _product_modules():
        if relative not in PARSED_IN and (found := _policy_parsers_imported(path)):
            wrong[relative] = sorted(found)
    assert not wrong, f"policy parsed outside table_meta/table_runtime.py: {wrong}"
    sample = ROOT / "tests" / "governor" / "test_scheduler.py"  # the check sees an import when there is one
    assert _policy_parsers_imported(sample) >= {"policy_of", "policy_for"}


# -- no import circle ---------------------------------------------------------------------------

class _Imports(ast.NodeVisitor):
    """Every `streamberg...` module a file imports when it runs, at any depth (an import inside
    a function is an import all the same); what `if TYPE_CHECKING:` guards never runs and is
    left out."""

    def __init__(self) -> None:
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found |= {a.name for a in node.names}

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self.found.add(node.module)
            self.found |= {f"{node.module}.{a.name}" for a in node.names}


def _import_graph(root: Path, folders: tuple[str, ...], package: str = "streamberg") -> dict[str, set[str]]:
    """module -> the package's modules it imports. Importing `a.b.c` runs the package `a.b`
    too (its __init__), except from inside `a.b` itself: a circle through a package's
    re-exports is a circle."""
    paths = {}
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            paths[".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = path
    modules = set(paths)
    graph = {}
    for module, path in paths.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        deps = set()
        for name in visitor.found:
            parts = name.split(".")
            for end in range(2, len(parts) + 1):  # the module and every package above it
                target = ".".join(parts[:end])
                inside = module == target or module.startswith(target + ".")
                if target in modules and not inside:
                    deps.add(target)
        graph[module] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """No two modules of the product reach each other through imports, lazy ones included (a
    function-level import hid the catalog's circle: catalog -> catalog_kinds -> catalog, the
    config's loading -> catalog_kinds -> spark -> catalog -> config). A floor stands on the
    ones below it only."""
    graph = _import_graph(ROOT, PRODUCT)
    assert "streamberg.common.catalog_kinds" in graph["streamberg.common.config.loading"]  # the graph sees imports
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_sees_circles(tmp_path: Path) -> None:
    """A circle through a lazy import, and one through a package's __init__, are found; an
    import guarded by TYPE_CHECKING is not one."""
    (tmp_path / "a" / "p").mkdir(parents=True)
    (tmp_path / "a" / "one.py").write_text("def f():\n    from streamberg.a import two\n")
    (tmp_path / "a" / "two.py").write_text("import streamberg.a.one\n")
    (tmp_path / "a" / "p" / "__init__.py").write_text("from streamberg.a.p.inner import X\n")
    (tmp_path / "a" / "p" / "inner.py").write_text("from streamberg.a.three import Y\nX = 1\n")
    (tmp_path / "a" / "three.py").write_text("from streamberg.a.p.other import Z\nY = 1\n")
    (tmp_path / "a" / "p" / "other.py").write_text("Z = 1\n")
    (tmp_path / "a" / "four.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from streamberg.a import five\n")
    (tmp_path / "a" / "five.py").write_text("from streamberg.a import four\n")
    circles = _circles(_import_graph(tmp_path, ("a",)))
    assert ["streamberg.a.one", "streamberg.a.two"] in circles
    assert ["streamberg.a.p", "streamberg.a.p.inner", "streamberg.a.three"] in circles
    assert not [c for c in circles if "streamberg.a.four" in c]


# -- one Kafka read loop (common/kafka_read.py) ------------------------------------------------

# Where a Kafka consumer is read from directly: one bounded consume (`consume_batch`), which the
# partition reader, replay, the fresh tail, its keeper and the ingest's source all read through.
KAFKA_READ_IN = {"common/kafka_read.py"}


def _kafka_reads(path: Path) -> list[str]:
    """Calls that read a Kafka consumer: any `.consume(...)`, and `.poll(...)` on a consumer."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            if node.func.attr == "consume" or (node.func.attr == "poll" and "consumer" in receiver.lower()):
                found.append(f"{receiver}.{node.func.attr}")
    return found




# Where a catalog for work may be opened outside the runtime, and why. common/catalog.py
# defines `load_catalog` (tests and benches open catalogs of their own with it: "another
# process" is another instance).
OPENS_CATALOGS = {"common/catalog.py"}


def _calls_named(names: Collection[str], attributes: Collection[str] = ()) -> Callable[[Path], list[str]]:
    """A finder of the calls of a function or method named in `names` (and of the attributes
    `attributes` names, as `SparkSession.builder`), each as `line N`."""
    def find(path: Path) -> list[str]:
        found = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in names:
                    found.append(f"line {node.lineno}")
            elif isinstance(node, ast.Attribute) and ast.unparse(node) in attributes:
                found.append(f"line {node.lineno}")
        return found

    return find


# Calls of `load_catalog` (a catalog opened anew, never closed by anyone).
_catalog_openings = _calls_named({"load_catalog"})


# The process's Spark session is its runtime's (common/runtime.py `spark`, through
# common/spark.py `process_session`): built on first use, stopped once when the command ends.
BUILDS_SPARK_IN = {"common/spark.py"}


# Sessions built outside the one owner: `build_spark_session(...)`, `SparkSession.builder`.
_spark_builds = _calls_named({"build_spark_session"}, {"SparkSession.builder"})


# One root config: a command loads its file with `load_tables` (a config of one table is a
# config of one route; `FleetConfig.many` and `one_table` say what differs), never with the
# loaders of one kind (`load_config`, `load_fleet`), which only that function chooses between.
LOADS_CONFIG_FILES_IN = {"common/config/loading.py"}
_KIND_LOADERS = {"load_config", "load_fleet", "as_fleet", "is_fleet", "_is_fleet"}


# Calls of a loader of one kind of config file.
_config_kind_loads = _calls_named(_KIND_LOADERS)


# Where an action's timing is decided: the one scheduler (table_meta/schedule.py), for the
# governor's fleet and for a component started alone (`keep_alone`).
TIMES_ACTIONS_IN = {"table_meta/schedule.py"}
_ACTION_INTERVALS = {"interval_seconds", "check_seconds"}  # merge., maintenance., maintenance.expire.


def _interval_waits(path: Path) -> list[str]:
    """Waits (`.wait(...)`, `sleep(...)`) timed by an action's interval: a loop of its own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("wait", "sleep") and any(isinstance(a, ast.Attribute) and a.attr in _ACTION_INTERVALS
                                                 for arg in node.args for a in ast.walk(arg)):
                found.append(f"line {node.lineno}")
    return found


# Where changes of a key are ranked (which is the newer): the change-order rule's one text
# (table_meta/change_order.py), run by Spark in the merge and DuckDB in a fresh read. The merge's
# regression check orders a key's changes by offset within a partition: it finds a sequence that
# went backwards, it does not choose the newer change.
RANKS_CHANGES_IN = {"table_meta/change_order.py", "merge/epochs.py: regressed: Window ordering"}
_RANKING_SQL = re.compile(r"row_number\s*\(\s*\)|\bover\s*\(\s*partition\s+by|\bqualify\b", re.IGNORECASE)


def _change_ranking(path: Path) -> list[str]:
    """Window orderings (`Window...orderBy`), ranking calls (`row_number()`, `rank()`) and SQL
    text that ranks rows (`row_number()`, `OVER (PARTITION BY`, `QUALIFY`), by enclosing function."""
    tree = ast.parse(path.read_text(), filename=str(path))
    owner: dict[ast.AST, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                owner[inner] = node.name  # the innermost def wins: walked after its outer one
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "orderBy" and ast.unparse(node.func.value).startswith("Window."):
                what = "Window ordering"
            elif node.func.attr in ("row_number", "rank", "dense_rank"):
                what = node.func.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _RANKING_SQL.search(node.value):
            what = "ranking SQL"
        if what is not None:
            found.append(f"{owner.get(node, '<module>')}: {what}")
    return found


# One owner of each thing, each rule with the modules it allows, a sample it must see and what
# it finds there (a check that cannot fail proves nothing):
# - module-level caches: catalogs, engines, consumers, admin clients and the facts asked of
#   them are the Runtime's (common/runtime.py); a governor or exporter that lives for weeks
#   leaked through exactly those;
# - Kafka reads: replay, the positions' reads, a route's sampling, the fresh tail and its
#   keeper read through one loop (assign, bounded consume, end detection, pause): five loops
#   had each their own error handling (replay dropped every error and waited out its idle
#   timeout; the keeper started over on a passing one); the ingest's source reads every table's
#   partitions continuously through the same bounded consume (`consume_batch`: it dropped a
#   client-wide fatal error, and would have waited on a dead client);
# - catalog openings: the product's catalogs for work are the runtime's (`shared_catalog`),
#   opened once a process and closed with it; a `load_catalog` in a command or an action
#   opened a catalog (an engine and its pool) each call, closed by no one (the column drop
#   opened one at every run under the governor);
# - Spark sessions built: `govern` built and stopped its own session, each component another;
# - config files loaded: a config of one table and a config of many were two models, 33
#   conversions and `is_fleet` branches in 8 files;
# - action timing: `streamberg merge` and `streamberg maintain` alone each timed their action with a
#   loop of their own (a merge every interval, a pass and the expiry checks between), beside the
#   governor's scheduler; they are that scheduler over one table now;
# - ranking changes: the change-order rule was written three times (the merge's Spark, the fresh
#   read's DuckDB SQL, the sequence encoding), held equal only by an end-to-end test.
ONE_OWNER = {
    "module-level caches": (_module_level_caches, KEPT_AT_MODULE_LEVEL, ":",
                            "import functools\n_a: dict[str, int] = {}\n_b = []\nC = {'k': 1}\n_d = dict()\n"
                            "@functools.cache\ndef f():\n    return 1\n",
                            ["_a", "_b", "_d", "f (memoized)"]),
    "Kafka reads": (_kafka_reads, KAFKA_READ_IN, ": ",
                    "def f(c, consumer, proc, producer):\n    c.consume(1, 0.1)\n    consumer.poll(1)\n"
                    "    proc.poll()\n    producer.poll(0)\n",
                    ["c.consume", "consumer.poll"]),
    "catalog openings": (_catalog_openings, OPENS_CATALOGS, ":",
                         "import c\ndef f(config):\n    load_catalog(config)\n    c.load_catalog(config)\n"
                         "    shared_catalog(config)\n",
                         ["line 3", "line 4"]),
    "Spark sessions built": (_spark_builds, BUILDS_SPARK_IN, ":",
                             "from pyspark.sql import SparkSession\ndef f(c):\n    build_spark_session(c, 'local', {})\n"
                             "    return SparkSession.builder.getOrCreate(), process_session(c, 'local', {})\n",
                             ["line 3", "line 4"]),
    "config files loaded": (_config_kind_loads, LOADS_CONFIG_FILES_IN, ":",
                            "import c\ndef f(p):\n    load_config(p)\n    c.load_fleet(p)\n    is_fleet(p)\n"
                            "    load_tables(p)\n",
                            ["line 3", "line 4", "line 5"]),
    "action timing": (_interval_waits, TIMES_ACTIONS_IN, ":",
                      "def f(stop, config, t, time, self):\n    stop.wait(max(0.0, config.merge.interval_seconds - t))\n"
                      "    stop.wait(min(config.maintenance.expire.check_seconds, t))\n"
                      "    time.sleep(config.interval_seconds)\n    stop.wait(1.0)\n"
                      "    stop.wait(self.settings.status_interval_seconds)\n",
                      ["line 2", "line 3", "line 4"]),
    "ranking changes": (_change_ranking, RANKS_CHANGES_IN, ": ",
                        "def f(df, F, Window, keys):\n    w = Window.partitionBy(*keys).orderBy('offset')\n"
                        "    df.withColumn('r', F.row_number().over(w))\n"
                        "    return 'SELECT *, ROW_NUMBER() OVER (PARTITION BY id ORDER BY seq DESC) FROM t'\n"
                        "def g(df):\n    return df.orderBy('x'), 'select * from t order by x'\n",
                        ["f: Window ordering", "f: ranking SQL", "f: row_number"]),
}


@pytest.mark.parametrize("rule", sorted(ONE_OWNER))
def test_one_owner(rule: str) -> None:
    find, allowed, join, _, _ = ONE_OWNER[rule]
    wrong = _findings(find, allowed, join)
    assert not wrong, f"{rule} outside their one owner: {wrong}"


@pytest.mark.parametrize("rule", sorted(ONE_OWNER))
def test_the_one_owner_check_sees(rule: str, tmp_path: Path) -> None:
    find, _, _, sample_text, expected = ONE_OWNER[rule]
    sample = tmp_path / "m.py"
    sample.write_text(sample_text)
    assert find(sample) == expected


# -- the benches share a harness (bench/harness.py) -------------------------------------------------
# Each bench added the checkout to the import path and started, stopped and wrote its broker and
# its results its own way (13 `sys.path.insert`s, 8 broker start-ups): the harness does it once.
HARNESS = "bench/harness.py"
BENCH_OWN = {"scripts/fleet_demo.py: EmbeddedBroker": "the demo keeps its broker in .streamberg/fleet for the "
             "operator to look at after; no bench result"}


def _bench_plumbing(path: Path) -> list[str]:
    """Import-path edits and embedded brokers started by the module itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name.startswith("sys.path."):
            found.append(name)
        elif name.split(".")[-1] == "EmbeddedBroker":
            found.append("EmbeddedBroker")
    return found


def test_benches_use_the_harness() -> None:
    modules = [path for folder in ("bench", "scripts") for path in sorted((ROOT / folder).rglob("*.py"))]
    wrong = [entry for path in modules if (relative := str(path.relative_to(ROOT))) != HARNESS
             for item in _bench_plumbing(path) if (entry := f"{relative}: {item}") not in BENCH_OWN]
    assert not wrong, f"a bench's own import path or broker (use bench/harness.py): {wrong}"


def test_the_bench_check_sees(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import sys\nsys.path.insert(0, 'x')\nsys.path.append('y')\nb = EmbeddedBroker(d)\n"
                      "c = broker.EmbeddedBroker(d)\nsys.exit(0)\n")
    assert _bench_plumbing(sample) == ["sys.path.insert", "sys.path.append", "EmbeddedBroker", "EmbeddedBroker"]
