"""A deterministic SSB-like denormalised ``lineorder`` table from DuckDB's TPC-H generator.

The Star Schema Benchmark (SSB) is TPC-H's lineitem/orders re-shaped into one fact table
with customer, supplier and part dimensions. The study this benchmark compares with ran on
the *denormalised* form (one wide table), filtering on ``s_city``, ``c_city`` and ``p_brand``.
TPC-H has no cities or SSB brands, so they are derived here the way SSB's dbgen builds them:

- ``c_city`` / ``s_city``: the first 9 characters of the nation name, space padded, plus one
  digit 0-9 (so 25 nations x 10 = 250 cities, e.g. ``'UNITED KI1'``).
- ``p_mfgr`` ``MFGR#m`` (5), ``p_category`` ``MFGR#mn`` (25, from TPC-H's ``Brand#mn``) and
  ``p_brand`` ``MFGR#mnbb`` with bb in 01..40 (1000 brands, SSB's ``p_brand1``).

SSB's dbgen picks the city digit and the brand suffix at random; here they come from an
integer mix of the dimension key, so the table is identical on every run and machine
(DuckDB's own ``hash()`` is not promised stable across versions, plain arithmetic is).
The cardinalities (250 / 250 / 1000) do not depend on the scale factor, exactly as in SSB.

Row order is ``(lo_orderkey, lo_linenumber)``; ``file_slot`` is an extra, non-table column that
says which of N random files a row goes to (see ``random_table``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from streamberg.common.log import get_logger

# The study's filter columns, in the order its table lists them.
STUDY_COLUMNS: tuple[str, ...] = ("s_city", "c_city", "p_brand")

# TPC-H lineitem rows per scale factor (SF1 = 6,001,215 rows); SSB lineorder has the same count.
ROWS_PER_SCALE_FACTOR = 6_001_215


class GeneratorUnavailable(RuntimeError):
    """DuckDB or its TPC-H extension is not installed; the message says how to get it."""


def _mix(expr: str, salt: int) -> str:
    """SQL for a 32-bit integer mix of a non-negative integer expression (a bijection per salt).

    Two rounds of multiply-xorshift, as in common hash finalisers; HUGEINT keeps the products
    exact so the result is the same whatever DuckDB's overflow rules.
    """
    m = 4294967296
    x = f"((CAST({expr} AS HUGEINT) + {salt}) * 2654435761 % {m})"
    x = f"((xor({x}, {x} >> 15)) * 2246822519 % {m})"
    return f"CAST(xor({x}, {x} >> 13) AS BIGINT)"


def lineorder_sql(shuffle_seed: int, files: int) -> str:
    """The denormalised SELECT over the TPC-H tables DuckDB's ``dbgen`` created.

    ``file_slot`` spreads rows evenly (file sizes differ by at most one row) and at random over
    ``files`` slots: rows are ranked by a seeded mix of their key, and the rank is cut in N.
    """
    city_digit = lambda key, salt: f"CAST(({_mix(key, salt)} >> 8) % 10 AS VARCHAR)"  # noqa: E731
    row_key = "(l.l_orderkey * 8 + l.l_linenumber)"
    return f"""
    WITH nation_region AS (
        SELECT n.n_nationkey, n.n_name, r.r_name
        FROM nation n JOIN region r ON n.n_regionkey = r.r_regionkey
    ),
    cust AS (
        SELECT c.c_custkey,
               rpad(left(nr.n_name, 9), 9, ' ') || {city_digit('c.c_custkey', 11)} AS c_city,
               nr.n_name AS c_nation, nr.r_name AS c_region, c.c_mktsegment
        FROM customer c JOIN nation_region nr ON c.c_nationkey = nr.n_nationkey
    ),
    supp AS (
        SELECT s.s_suppkey,
               rpad(left(nr.n_name, 9), 9, ' ') || {city_digit('s.s_suppkey', 23)} AS s_city,
               nr.n_name AS s_nation, nr.r_name AS s_region
        FROM supplier s JOIN nation_region nr ON s.s_nationkey = nr.n_nationkey
    ),
    prt AS (
        SELECT p.p_partkey,
               'MFGR#' || substr(p.p_mfgr, 14, 1) AS p_mfgr,
               'MFGR#' || substr(p.p_brand, 7, 2) AS p_category,
               'MFGR#' || substr(p.p_brand, 7, 2)
                   || lpad(CAST(({_mix('p.p_partkey', 37)} >> 8) % 40 + 1 AS VARCHAR), 2, '0') AS p_brand,
               split_part(p.p_name, ' ', 1) AS p_color, p.p_type, p.p_size
        FROM part p
    ),
    lo AS (
        SELECT
            l.l_orderkey AS lo_orderkey, l.l_linenumber AS lo_linenumber,
            o.o_custkey AS lo_custkey, l.l_partkey AS lo_partkey, l.l_suppkey AS lo_suppkey,
            o.o_orderdate AS lo_orderdate, o.o_orderpriority AS lo_orderpriority,
            o.o_shippriority AS lo_shippriority, l.l_quantity AS lo_quantity,
            l.l_extendedprice AS lo_extendedprice, l.l_discount AS lo_discount,
            CAST(l.l_extendedprice * (1 - l.l_discount) AS DECIMAL(15, 2)) AS lo_revenue,
            l.l_tax AS lo_tax, l.l_commitdate AS lo_commitdate, l.l_shipmode AS lo_shipmode,
            {_mix(row_key, shuffle_seed)} AS shuffle_key
        FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey
    )
    SELECT lo.* EXCLUDE (shuffle_key),
           c.c_city, c.c_nation, c.c_region, c.c_mktsegment,
           s.s_city, s.s_nation, s.s_region,
           p.p_mfgr, p.p_category, p.p_brand, p.p_color, p.p_type, p.p_size,
           CAST((row_number() OVER (ORDER BY lo.shuffle_key, lo.lo_orderkey, lo.lo_linenumber) - 1)
                * {files} // count(*) OVER () AS INTEGER) AS file_slot
    FROM lo
    JOIN cust c ON lo.lo_custkey = c.c_custkey
    JOIN supp s ON lo.lo_suppkey = s.s_suppkey
    JOIN prt p ON lo.lo_partkey = p.p_partkey
    """


@dataclass(frozen=True)
class GenerationSpec:
    """What to generate: TPC-H/SSB scale factor, how many random files, and the shuffle seed."""

    scale: float
    files: int
    seed: int = 42

    @property
    def expected_rows(self) -> int:
        return int(ROWS_PER_SCALE_FACTOR * self.scale)


def _tpch_extension_path() -> Path:
    try:
        import duckdb
        import duckdb_extension_tpch
    except ImportError:
        raise GeneratorUnavailable(
            "duckdb and duckdb-extension-tpch are needed: pip install -e '.[bench]'"
        ) from None
    # The PyPI wheel ships the extension binary for exactly its DuckDB version; loading it
    # by path avoids DuckDB's INSTALL, which would download from a host we cannot reach.
    path = Path(duckdb_extension_tpch.__path__[0]) / "extensions" / f"v{duckdb.__version__}" / "tpch.duckdb_extension"
    if not path.is_file():
        raise GeneratorUnavailable(
            f"{path} not found: duckdb-extension-tpch must have the same version as duckdb ({duckdb.__version__})"
        )
    return path


class LineorderGenerator:
    """Runs DuckDB's dbgen once and serves the denormalised table as Arrow, ordered by file slot.

    Use as a context manager; the DuckDB database lives in ``spill_dir`` (or memory) and is
    dropped on exit.
    """

    # The steps __enter__ reports to ``progress`` (one call each, with the step's name).
    STEPS = ("dbgen", "denormalise and shuffle")

    def __init__(self, spec: GenerationSpec, spill_dir: Path | None = None, threads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._progress = progress or (lambda step: None)
        self._spill_dir = spill_dir
        self._threads = threads
        self._conn = None
        self.rows = 0

    def __enter__(self) -> LineorderGenerator:
        import duckdb

        log = get_logger("bench.datagen", scale=self.spec.scale, files=self.spec.files, seed=self.spec.seed)
        database = ":memory:"
        if self._spill_dir is not None:
            self._spill_dir.mkdir(parents=True, exist_ok=True)
            database = str(self._spill_dir / "tpch.duckdb")
            Path(database).unlink(missing_ok=True)
        conn = duckdb.connect(database)
        # Our own tqdm bar reports progress; DuckDB's bar would interleave with it.
        conn.execute("SET enable_progress_bar = false")
        if self._threads:
            conn.execute(f"SET threads = {int(self._threads)}")
        conn.execute(f"LOAD '{_tpch_extension_path()}'")
        log.info("generating TPC-H tables")
        conn.execute(f"CALL dbgen(sf = {self.spec.scale})")
        self._progress(self.STEPS[0])
        # Materialise once, sorted by slot, so each file's rows are one contiguous scan.
        conn.execute(
            f"CREATE TABLE lineorder AS SELECT * FROM ({lineorder_sql(self.spec.seed, self.spec.files)}) ORDER BY file_slot, lo_orderkey, lo_linenumber"
        )
        for table in ("lineitem", "orders", "customer", "supplier", "part", "partsupp", "nation", "region"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        self.rows = conn.execute("SELECT count(*) FROM lineorder").fetchone()[0]
        self._progress(self.STEPS[1])
        log.info("lineorder ready", rows=self.rows)
        self._conn = conn
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._spill_dir is not None:
            (self._spill_dir / "tpch.duckdb").unlink(missing_ok=True)
            (self._spill_dir / "tpch.duckdb.wal").unlink(missing_ok=True)

    def _require(self):
        if self._conn is None:
            raise RuntimeError("use LineorderGenerator as a context manager")
        return self._conn

    def schema(self) -> pa.Schema:
        """The table schema (without the ``file_slot`` helper column)."""
        return self._require().execute("SELECT * EXCLUDE (file_slot) FROM lineorder LIMIT 0").arrow().schema

    def slots(self, batch_rows: int = 1 << 17) -> Iterator[tuple[int, pa.Table]]:
        """Yield ``(slot, rows)`` for every file slot in order, streaming from DuckDB."""
        reader = self._require().execute("SELECT * FROM lineorder ORDER BY file_slot, lo_orderkey, lo_linenumber").to_arrow_reader(batch_rows)
        current: int | None = None
        pending: list[pa.Table] = []
        for batch in reader:
            table = pa.Table.from_batches([batch])
            slots = table.column("file_slot").to_numpy()
            # Cut the batch where the slot changes; a batch may span several slots.
            cuts = [0, *((slots[1:] != slots[:-1]).nonzero()[0] + 1).tolist(), len(slots)]
            for start, end in zip(cuts[:-1], cuts[1:]):
                piece = table.slice(start, end - start)
                slot = int(slots[start])
                if current is not None and slot != current:
                    yield current, pa.concat_tables(pending).drop_columns(["file_slot"])
                    pending = []
                current = slot
                pending.append(piece)
        if current is not None:
            yield current, pa.concat_tables(pending).drop_columns(["file_slot"])

    def distinct_values(self, column: str) -> list[object]:
        """Every distinct value of a column, sorted (the predicate sampler draws from these)."""
        return [row[0] for row in self._require().execute(
            f'SELECT DISTINCT "{column}" FROM lineorder WHERE "{column}" IS NOT NULL ORDER BY 1'
        ).fetchall()]
