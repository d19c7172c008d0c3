"""Benchmark results: what was measured, the summary per layout, the targets, the JSON file.

Every figure here is derived from the planned-file counts and manifest bounds recorded in
the run; the only constants are the study's published figures, kept apart in ``STUDY`` and
used solely as targets to compare with.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .predicates import Predicate

# The published study (SSB SF100, 533M rows, 1000 Iceberg files): share of files skipped per
# point query by Iceberg's min/max pruning. Targets only; never used as a measured figure.
STUDY_FILES = 1000
STUDY: dict[str, dict[str, float]] = {
    "random": {"s_city": 0.0, "c_city": 0.0, "p_brand": 0.0},
    "sort": {"s_city": 99.9, "c_city": 0.0, "p_brand": 0.0},
    "zorder": {"s_city": 81.4, "c_city": 83.6, "p_brand": 86.5},
    "hilbert": {"s_city": 85.5, "c_city": 86.9, "p_brand": 88.3},
}
STUDY_LABELS = {"random": "random", "sort": "linear order", "zorder": "boundary-based Z-order", "hilbert": "boundary-based Hilbert"}


@dataclass
class LayoutResult:
    """One layout's table and what Iceberg planned for every predicate on it."""

    layout: str
    table: str
    implementation: str
    files: int
    rows: int
    seconds: float | None
    planned: list[int]
    # Mean number of files whose [min, max] contains a value, over each column's distinct values.
    mean_depth: dict[str, float] = field(default_factory=dict)

    def skipped(self, index: int) -> float:
        """Percent of this table's files Iceberg skipped for predicate ``index``."""
        return 100.0 * (1 - self.planned[index] / self.files) if self.files else 0.0


@dataclass
class Target:
    layout: str
    column: str
    wanted: float
    measured: float
    against: str

    @property
    def met(self) -> bool:
        # Rounded to the precision the figures are printed with, so 81.40 vs 81.4 is met.
        return round(self.measured, 1) >= round(self.wanted, 1)


@dataclass
class BenchResult:
    scale: float
    files: int
    rows: int
    seed: int
    columns: list[str]
    predicates: list[Predicate]
    layouts: list[LayoutResult]
    seconds: dict[str, float] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)

    def groups(self) -> list[tuple[str, str]]:
        """(kind, label) groups in first-seen order: point per column, then pairs, then ranges."""
        seen: dict[tuple[str, str], None] = {}
        for p in self.predicates:
            seen.setdefault((p.kind, p.label), None)
        return list(seen)

    def mean_skipped(self, layout: LayoutResult, kind: str, label: str) -> float | None:
        values = [layout.skipped(i) for i, p in enumerate(self.predicates) if p.kind == kind and p.label == label]
        return statistics.fmean(values) if values else None

    def mean_point_skipped(self, layout: LayoutResult) -> float | None:
        """Point-query skipping averaged over the columns (each column weighs the same)."""
        values = [v for c in self.columns if (v := self.mean_skipped(layout, "point", c)) is not None]
        return statistics.fmean(values) if values else None

    def layout(self, name: str) -> LayoutResult | None:
        return next((r for r in self.layouts if r.layout == name), None)

    def targets(self) -> list[Target]:
        """The issue's targets: zorder/hilbert >= the study's rows and >= zorder-iceberg, per column."""
        out: list[Target] = []
        baseline = self.layout("zorder-iceberg")
        for name in ("zorder", "hilbert"):
            result = self.layout(name)
            if result is None:
                continue
            for column in self.columns:
                measured = self.mean_skipped(result, "point", column)
                if measured is None:
                    continue
                if column in STUDY[name]:
                    out.append(Target(name, column, STUDY[name][column], measured, f"study {STUDY_LABELS[name]}"))
                if baseline is not None and (base := self.mean_skipped(baseline, "point", column)) is not None:
                    out.append(Target(name, column, base, measured, "zorder-iceberg, same run"))
            # Per column, a layout that ignores one column can win on the others; the mean over
            # the columns says which layout serves the whole query mix better.
            if baseline is not None and len(self.columns) > 1:
                measured, base = self.mean_point_skipped(result), self.mean_point_skipped(baseline)
                if measured is not None and base is not None:
                    out.append(Target(name, "mean of columns", base, measured, "zorder-iceberg, same run"))
        return out

    def summary(self) -> dict[str, Any]:
        return {
            r.layout: {
                f"{kind}:{label}": round(value, 2)
                for kind, label in self.groups()
                if (value := self.mean_skipped(r, kind, label)) is not None
            }
            for r in self.layouts
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "data-skipping",
            "scale": self.scale, "files": self.files, "rows": self.rows, "seed": self.seed,
            "columns": self.columns,
            "rows_per_file": self.rows / self.files if self.files else 0,
            "study": {"files": STUDY_FILES, "point_skipped_percent": STUDY},
            "summary_skipped_percent": self.summary(),
            "point_skipped_mean_of_columns": {
                r.layout: round(v, 2) for r in self.layouts if (v := self.mean_point_skipped(r)) is not None
            },
            "targets": [{**asdict(t), "met": t.met} for t in self.targets()],
            "layouts": [asdict(r) for r in self.layouts],
            "predicates": [p.to_json() for p in self.predicates],
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "environment": self.environment,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchResult:
        """Rebuild a result from its JSON file (to re-print it; figures recomputed from the counts)."""
        predicates = [Predicate(p["kind"], tuple(p["columns"]), tuple(p["values"])) for p in data["predicates"]]
        layouts = [LayoutResult(**r) for r in data["layouts"]]
        return cls(scale=data["scale"], files=data["files"], rows=data["rows"], seed=data["seed"], columns=data["columns"],
                   predicates=predicates, layouts=layouts, seconds=data.get("seconds", {}),
                   environment=data.get("environment", {}))

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def format_tables(result: BenchResult) -> str:
    """The printed report: point skipping per column (the study's table), other predicates, targets."""
    out: list[str] = []
    per_file = result.rows / result.files if result.files else 0
    out.append(f"Files skipped by Iceberg scan planning (mean over sampled predicates); {result.rows:,} rows, "
                f"{result.files} files per layout (~{per_file:,.0f} rows/file), SSB-like scale {result.scale}")
    out.append("")
    points = [(k, label) for k, label in result.groups() if k == "point"]
    header = ["layout", "files", *[label for _, label in points], "mean of columns", "mean files/point query", "layout time"]
    rows = []
    for r in result.layouts:
        n_point = [r.planned[i] for i, p in enumerate(result.predicates) if p.kind == "point"]
        rows.append([
            r.layout, str(r.files), *[_fmt(result.mean_skipped(r, "point", label)) for _, label in points],
            _fmt(result.mean_point_skipped(r)),
            f"{statistics.fmean(n_point):.1f}" if n_point else "-",
            "-" if r.seconds is None else f"{r.seconds:.0f}s",
        ])
    out.append("Point predicates (col = value), % of files skipped:")
    out.append(_table(header, rows))
    others = [(k, label) for k, label in result.groups() if k != "point"]
    if others:
        out.append("")
        out.append("Two-column (a = x AND b = y) and range (col BETWEEN lo AND hi) predicates, % of files skipped:")
        header = ["layout", *[f"{'range ' if k == 'range' else ''}{label}" for k, label in others]]
        out.append(_table(header, [[r.layout, *[_fmt(result.mean_skipped(r, k, label)) for k, label in others]] for r in result.layouts]))
    depth_cols = [c for c in result.columns if any(c in r.mean_depth for r in result.layouts)]
    if depth_cols:
        out.append("")
        out.append("Average overlap depth (files whose min/max range covers a value, mean over all distinct values; "
                   "ideal is files / distinct values, at least 1):")
        out.append(_table(["layout", *depth_cols], [[r.layout, *[f"{r.mean_depth.get(c, float('nan')):.1f}" for c in depth_cols]] for r in result.layouts]))
    out.append("")
    out.append(f"The study's figures (SSB SF100, 533M rows, {STUDY_FILES} files), % of files skipped per point query:")
    study_cols = [c for c in STUDY["random"]]
    out.append(_table(["layout", *study_cols], [[STUDY_LABELS[k], *[f"{v[c]:.1f}%" for c in study_cols]] for k, v in STUDY.items()]))
    targets = result.targets()
    if targets:
        out.append("")
        note = "" if result.files == STUDY_FILES else f" (the study's targets are for {STUDY_FILES} files; this run has {result.files})"
        out.append(f"Targets{note}:")
        out.append(_table(["layout", "column", "measured", "target", "against", "met"],
                          [[t.layout, t.column, _fmt(t.measured), _fmt(t.wanted), t.against, "yes" if t.met else "NO"] for t in targets]))
    return "\n".join(out)
