"""PNG charts of the incremental clustering benchmark (matplotlib, from the `bench` extra)."""

from __future__ import annotations

from pathlib import Path

from .scenario import COLUMNS, RunResult

COLORS = {"c1": "#1f77b4", "c2": "#ff7f0e", "c3": "#2ca02c"}


def write_report(runs: list[RunResult], knob: list[RunResult], directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    fig, axes = plt.subplots(2, len(runs), figsize=(4.6 * len(runs), 7.5), squeeze=False)
    for col, result in enumerate(runs):
        spec = result.spec
        passes = [p.pass_number for p in result.passes]
        top, bottom = axes[0][col], axes[1][col]
        for column in COLUMNS:
            top.plot(passes, [p.files_per_query[column] for p in result.passes], color=COLORS[column],
                     label=f"{column} incremental")
            ref = [(p.pass_number, p.reference_files_per_query[column]) for p in result.passes
                   if p.reference_files_per_query]
            top.plot([x for x, _ in ref], [y for _, y in ref], "o--", color=COLORS[column], alpha=0.7,
                     label=f"{column} full optimize")
        top.set_title(f"{spec['scenario']} / {spec['strategy']} (merge_factor "
                      f"{result.final['policy']['merge_factor']})", fontsize=10)
        top.set_xlabel("pass")
        top.set_ylabel("files read per point query")
        top.legend(fontsize=7)
        bottom.plot(passes, [p.write_amplification for p in result.passes], color="#444444")
        bottom.set_xlabel("pass")
        bottom.set_ylabel("write amplification (rewritten / ingested bytes)")
    fig.tight_layout()
    path = directory / "incremental-passes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    if knob:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        xs = [r.final["write_amplification"] for r in knob]
        ys = [sum(r.final["ratio_whole_table"].values()) / len(COLUMNS) for r in knob]
        ax.plot(xs, ys, "o-", color="#1f77b4")
        for r, x, y in zip(knob, xs, ys):
            ax.annotate(f"merge_factor {r.final['policy']['merge_factor']}", (x, y), fontsize=8,
                        textcoords="offset points", xytext=(5, 5))
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        spec = knob[0].spec
        ax.set_title(f"query cost vs write amplification ({spec['scenario']} / {spec['strategy']}, "
                     f"{knob[0].final['passes']} passes)", fontsize=10)
        ax.set_xlabel("write amplification")
        ax.set_ylabel("files read / full optimize's (mean of columns)")
        fig.tight_layout()
        path = directory / "incremental-knob.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
