"""Scaling, the table users publish: throughput against world size with the ideal line.

For every benchmark case measured at more than one world size (the same case key but ``world_size``):

- ``collectives``: bus bandwidth (GB/s); busbw is normalised so that the ideal is flat (nccl-tests), so
  ideal(n) = busbw(n0) and efficiency = busbw(n) / busbw(n0);
- ``zero`` and ``pipeline`` (weak scaling: each rank's work is fixed: ZeRO's batch per rank, the pipeline's
  layers per stage): throughput = work per rank x n / step time, ideal(n) = throughput(n0) x n / n0;
- ``tensor_parallel`` (strong scaling: one global batch): throughput = tokens / step time, ideal as above.

n0 is the smallest world size measured for the case. ``scaling.csv`` is tidy (one row per case x world
size): publishing is one ``pd.read_csv`` and one plot.
"""

from __future__ import annotations

from harness.records.results import BENCHMARK_KEY

KINDS = {"collectives": ("busbw", "GB/s"), "zero": ("weak", "tokens/s"), "pipeline": ("weak", "rows/s"),
         "tensor_parallel": ("strong", "tokens/s")}
COLUMNS = ["suite", "op", "impl", "backend", "dtype", "bytes", "case", "world_size", "time_p50_us", "throughput",
           "unit", "ideal", "efficiency", "scaling"]


def scaling_table(bench):
    import pandas as pd

    ok = bench[(bench["status"] == "ok") & bench["suite"].isin(list(KINDS)) & (bench["time_p50_us"] > 0)].copy()
    if ok.empty:
        return pd.DataFrame(columns=COLUMNS)
    case_cols = [c for c in BENCHMARK_KEY if c not in ("suite", "op", "impl", "backend", "dtype", "world_size")]
    ok["case"] = ok[case_cols].apply(lambda r: " ".join(f"{c}={_fmt(v)}" for c, v in r.items() if _fmt(v)), axis=1)
    rows = []
    for _, g in ok.groupby(["suite", "op", "impl", "backend", "dtype", "case"], dropna=False):
        if g["world_size"].nunique() < 2:
            continue
        g = g.sort_values("world_size").drop_duplicates("world_size")
        kind, unit = KINDS[g["suite"].iloc[0]]
        n = g["world_size"].astype(float)
        if kind == "busbw":
            tput = g["busbw_gbps"]
        else:
            work = g["count"].astype(float) * (n if kind == "weak" else 1.0)
            tput = work / (g["time_p50_us"] * 1e-6)
        n0, t0 = n.iloc[0], tput.iloc[0]
        ideal = pd.Series(t0, index=g.index) if kind == "busbw" else t0 * n / n0
        rows.append(g.assign(throughput=tput, unit=unit, ideal=ideal, efficiency=tput / ideal, scaling=kind)[COLUMNS])
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=COLUMNS)


def _fmt(v) -> str:
    if v is None or v != v or v == "":
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def scaling_section(bench, run_dir, md) -> list[str]:
    """Write scaling.csv (and scaling.png); the report's section (empty when nothing spans two world sizes)."""
    table = scaling_table(bench)
    if table.empty:
        return []
    table.to_csv(run_dir / "scaling.csv", index=False)
    out = ["## Scaling", "",
           "Throughput against world size beside the ideal (collectives: bus bandwidth, ideally flat; ZeRO and "
           "pipeline: weak scaling, ideally linear; tensor parallel: strong scaling, ideally linear) and the "
           "parallel efficiency = throughput / ideal. Tidy rows in `scaling.csv`. On 2 CPU cores more ranks "
           "share the same cores: efficiency below 1 is expected here and says nothing of a GPU node.", ""]
    summary = table.groupby(["suite", "op", "impl", "world_size"])["efficiency"].median().unstack("world_size")
    summary.columns = [f"n={n}" for n in summary.columns]
    out += ["Median parallel efficiency over each suite's cases (sizes, layers):", "",
            md(summary.reset_index(), ".2f", index=False), ""]
    if _plot(table, run_dir / "scaling.png"):
        out += ["![scaling](scaling.png)", ""]
    return out


def _plot(table, path) -> bool:
    import matplotlib.pyplot as plt

    fig = scaling_figure(table)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def scaling_figure(table):
    """Small multiples: one panel per suite, operation (collective, stage, schedule, layer kind) and dtype, one
    line per implementation in its report-wide colour (``impl_colors``) — its largest case, so a panel
    holds as many lines as implementations — with its ideal dashed in the same colour; the legend outside
    the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = impl_colors(table["impl"])
    size = table["bytes"].fillna(0) if "bytes" in table else 0
    table = table.assign(_size=size)
    largest = table[table["_size"] == table.groupby(["suite", "op", "dtype", "impl"], dropna=False)["_size"]
                    .transform("max")]
    panels = list(largest.groupby(["suite", "op", "dtype"], sort=True, dropna=False))
    cols = min(4, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.3 * cols, 2.6 * rows_n + 0.6), squeeze=False)
    for ax, ((suite, op, dtype), rows) in zip(axes.flat, panels, strict=False):
        for impl, g in rows.groupby("impl"):
            g = g[g["case"] == g["case"].iloc[-1]].sort_values("world_size")
            ax.plot(g["world_size"], g["throughput"], marker="o", ms=3, color=colors[impl])
            ax.plot(g["world_size"], g["ideal"], ls="--", lw=0.8, color=colors[impl])
        ax.set_title(f"{suite}: {op}" + ("" if dtype in ("float32", None) or dtype != dtype else f" ({dtype})"),
                     fontsize=8)
        ax.set_ylabel(rows["unit"].iloc[0], fontsize=7)
        ax.set_xticks(sorted(rows["world_size"].unique()))
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("world size", fontsize=7)
    handles = [Line2D([], [], color=c, marker="o", ms=3, label=i) for i, c in colors.items()]
    handles.append(Line2D([], [], color="grey", ls="--", lw=0.8, label="ideal (same colour)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.6 / (2.6 * rows_n + 0.6), 1, 1))
    return fig


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def impl_colors(impls) -> dict[str, str]:
    """One colour per implementation, the same in every plot of a report: the sorted names of the run's
    implementations in the palette's order (a user's ``package.module:object`` included)."""
    names = sorted({str(i) for i in impls if str(i) not in ("", "nan")})
    return {name: _PALETTE[k % len(_PALETTE)] for k, name in enumerate(names)}
