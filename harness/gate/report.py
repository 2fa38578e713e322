"""The comparison section of ``paritybench report BASELINE RUN_DIR``: the gate's verdicts and a ratio plot."""

from __future__ import annotations

import math
from pathlib import Path

from . import render
from .cli import compare_paths

THRESHOLD, CONFIDENCE = 0.10, 0.99


def comparison_section(baseline: str, run_dir: Path) -> list[str]:
    header, records = compare_paths(baseline, str(run_dir), THRESHOLD, CONFIDENCE, allow_env_change=True)
    s = render.summary(records)
    out = [f"## Comparison with baseline `{baseline}`", "",
           f"The gate's verdicts (`paritybench compare {baseline} {run_dir}`: threshold {THRESHOLD:.0%}, confidence "
           f"{CONFIDENCE:g}): **{s['regressions']} regression(s)** in {s['judged']} judged items.", ""]
    out += render.markdown_notes(header, s) + render.markdown_table(records)
    if plot_ratios(records, run_dir / "comparison.png"):
        out += ["Time ratio new / baseline per case and per implementation (the gate's estimate: between runs "
                "where the baseline holds several, else over iterations; bars: its confidence interval; dashed: "
                f"the ±{THRESHOLD:.0%} threshold):", "", "![comparison](comparison.png)", ""]
    return out


def plot_ratios(records: list[dict], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = sorted((r for r in records if r["kind"] == "time" and r.get("ratio")), key=lambda r: r["ratio"])
    if not times:
        return False
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(times) + 1.2))
    for i, r in enumerate(times):
        high = r["high"] if math.isfinite(r["high"]) else r["ratio"] * 4
        color = "tab:red" if r["verdict"] == "slower" else "tab:green" if r["verdict"] == "faster" else "tab:gray"
        ax.plot([max(r["low"], 1e-3), high], [i, i], color=color, lw=1.5)
        ax.plot(r["ratio"], i, "o", color=color, ms=3)
    ax.axvline(1.0, color="black", lw=0.8)
    for x in (1 + THRESHOLD, 1 / (1 + THRESHOLD)):
        ax.axvline(x, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(range(len(times)), [r["case"] for r in times], fontsize=6)
    ax.set_xlabel("time ratio new / baseline")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
