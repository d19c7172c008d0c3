"""The layout report: PNG charts drawn from the run's own measurements.

- ``skipped_point.png``: % of files skipped per point query, per column and layout, with the
  study's figures as markers where it has one.
- ``skipped_other.png``: the same for two-column and range predicates.
- ``file_ranges_<column>.png``: every file's [min, max] on the column as a vertical bar (y is
  the value's rank among the column's distinct values), one panel per layout; overlap shows
  as bars stacking over the same heights.
- ``overlap_depth.png``: for every value, how many files' ranges cover it (what a point
  query on that value must read), per layout, with the mean in the legend.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .planning import FileBounds, coverage_depth
from .results import STUDY, BenchResult

STUDY_FILES_LABEL = "SSB SF100, 1000 files"

# Layout colours stay the same in every chart.
COLOURS = {
    "random": "#9e9e9e", "sort": "#8c564b", "binpack": "#bcbd22", "zorder-iceberg": "#ff7f0e",
    "iceberg-action-zorder": "#e377c2", "zorder": "#1f77b4", "hilbert": "#2ca02c",
}


def _colour(layout: str) -> str:
    return COLOURS.get(layout, "#17becf")


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, result: BenchResult, groups: Sequence[tuple[str, str]], study: bool) -> None:
    n = len(result.layouts)
    width = 0.8 / max(n, 1)
    for j, layout in enumerate(result.layouts):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(groups))]
        ys = [result.mean_skipped(layout, kind, label) or 0.0 for kind, label in groups]
        bars = ax.bar(xs, ys, width, label=layout.layout, color=_colour(layout.layout))
        ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=7, padding=1)
        if study and layout.layout in STUDY:
            sx = [x for x, (_, label) in zip(xs, groups) if label in STUDY[layout.layout]]
            sy = [STUDY[layout.layout][label] for _, label in groups if label in STUDY[layout.layout]]
            # Unlabelled: the caller adds one legend entry for all study markers.
            ax.scatter(sx, sy, marker="_", s=300, color="black", linewidths=2, zorder=3)
    ax.set_xticks(range(len(groups)), [("range " if k == "range" else "") + label for k, label in groups], fontsize=8)
    ax.set_ylim(0, 108)
    ax.set_ylabel("% of files skipped (mean)")
    ax.grid(axis="y", alpha=0.3)


def skipped_charts(result: BenchResult, out: Path) -> list[Path]:
    plt = _plt()
    written = []
    points = [(k, label) for k, label in result.groups() if k == "point"]
    fig, ax = plt.subplots(figsize=(max(7, 2.2 * len(points) + 3), 4.8))
    _bars(ax, result, points, study=True)
    handles, labels = ax.get_legend_handles_labels()
    from matplotlib.lines import Line2D

    if any(r.layout in STUDY for r in result.layouts):
        handles.append(Line2D([], [], color="black", marker="_", linestyle="", markersize=14, markeredgewidth=2))
        labels.append(f"study ({STUDY_FILES_LABEL})")
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"Point queries: files skipped by Iceberg's min/max pruning\n"
                 f"{result.rows:,} rows in {result.files} files per layout", fontsize=10)
    fig.tight_layout()
    path = out / "skipped_point.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    written.append(path)

    others = [(k, label) for k, label in result.groups() if k != "point"]
    if others:
        fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(others) + 3), 4.8))
        _bars(ax, result, others, study=False)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_title("Two-column (a = x AND b = y) and range predicates: files skipped", fontsize=10)
        fig.tight_layout()
        path = out / "skipped_other.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        written.append(path)
    return written


def _rank(values: Sequence[Any], value: Any, upper: bool) -> int:
    if value is None:
        return len(values) - 1 if upper else 0
    if upper:
        return max(0, bisect.bisect_right(values, value) - 1)
    return min(len(values) - 1, bisect.bisect_left(values, value))


def file_range_charts(
    result: BenchResult,
    bounds: Mapping[str, Mapping[str, Sequence[FileBounds]]],
    distinct: Mapping[str, Sequence[Any]],
    out: Path,
) -> list[Path]:
    """One PNG per column: each layout's files as [min, max] bars over the value ranks."""
    plt = _plt()
    written = []
    for column in result.columns:
        values = list(distinct[column])
        layouts = [r for r in result.layouts if column in bounds.get(r.layout, {})]
        if not layouts or not values:
            continue
        fig, axes = plt.subplots(len(layouts), 1, figsize=(11, 1.9 * len(layouts) + 0.8), sharey=True, squeeze=False)
        for ax, layout in zip(axes[:, 0], layouts):
            spans = sorted((_rank(values, b.lower, False), _rank(values, b.upper, True)) for b in bounds[layout.layout][column])
            xs = range(len(spans))
            ax.vlines(xs, [lo - 0.4 for lo, _ in spans], [hi + 0.4 for _, hi in spans],
                      color=_colour(layout.layout), linewidth=max(0.3, min(2.0, 300 / max(len(spans), 1))))
            depth = layout.mean_depth.get(column)
            ax.set_title(f"{layout.layout}: {len(spans)} files, a value is covered by {depth:.1f} files on average"
                         if depth is not None else layout.layout, fontsize=9, loc="left")
            ax.set_xlim(-1, len(spans))
            ax.set_ylim(-1, len(values))
            ax.set_ylabel("value rank", fontsize=8)
            ax.tick_params(labelsize=7)
        axes[-1, 0].set_xlabel("files, ordered by their minimum", fontsize=8)
        ticks = sorted({0, len(values) // 2, len(values) - 1})
        axes[0, 0].set_yticks(ticks, [str(values[t]) for t in ticks])
        fig.suptitle(f"Each file's [min, max] range on {column} ({len(values)} distinct values); "
                     f"short bars = tight files, tall bars overlap every query", fontsize=10)
        fig.tight_layout()
        path = out / f"file_ranges_{column}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def overlap_depth_chart(
    result: BenchResult,
    bounds: Mapping[str, Mapping[str, Sequence[FileBounds]]],
    distinct: Mapping[str, Sequence[Any]],
    out: Path,
) -> Path | None:
    plt = _plt()
    columns = [c for c in result.columns if distinct.get(c)]
    if not columns:
        return None
    fig, axes = plt.subplots(1, len(columns), figsize=(5.2 * len(columns), 4.2), squeeze=False)
    for ax, column in zip(axes[0], columns):
        values = list(distinct[column])
        for layout in result.layouts:
            if column not in bounds.get(layout.layout, {}):
                continue
            depth = coverage_depth(bounds[layout.layout][column], values)
            mean = sum(depth) / len(depth)
            ax.plot(range(len(values)), depth, label=f"{layout.layout} (mean {mean:.1f})", color=_colour(layout.layout), linewidth=1)
        ax.set_yscale("log")
        # Plain numbers on the log axis: "30", not "3 x 10^1".
        from matplotlib.ticker import ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"{column}: files covering each value", fontsize=9)
        ax.set_xlabel(f"value rank (of {len(values)})", fontsize=8)
        ax.set_ylabel(f"files (of {result.files}), log scale", fontsize=8)
        ax.legend(fontsize=7, loc="best", framealpha=0.8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Overlap depth: how many files a point query on each value must read", fontsize=10)
    fig.tight_layout()
    path = out / "overlap_depth.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    result: BenchResult,
    bounds: Mapping[str, Mapping[str, Sequence[FileBounds]]],
    distinct: Mapping[str, Sequence[Any]],
    out: Path,
) -> list[Path]:
    """Write every chart into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = skipped_charts(result, out)
    written += file_range_charts(result, bounds, distinct, out)
    depth = overlap_depth_chart(result, bounds, distinct, out)
    if depth is not None:
        written.append(depth)
    return written
