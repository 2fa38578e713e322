"""The collectives' report section: busbw per size, reference vs native ratios, plots, the exact check."""

from __future__ import annotations

from pathlib import Path

# The reference/native target the foundation issue sets: ring all-reduce busbw >= 0.9x gloo's at 16-64 MiB.
RATIO_BAND = (16 << 20, 64 << 20)
RATIO_TARGET = 0.9


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{int(n)} B"


def busbw_table(bench, op: str):
    """busbw (GB/s) by size (rows) and (world size, implementation) (columns) for one collective."""
    rows = bench[(bench["suite"] == "collectives") & (bench["op"] == op) & (bench["status"] == "ok")]
    if rows.empty:
        return rows
    table = rows.pivot_table(index="bytes", columns=["world_size", "impl"], values="busbw_gbps", aggfunc="first")
    table.columns = [f"n={n} {impl}" for n, impl in table.columns]
    table.index = [human_bytes(b) for b in table.index]
    table.index.name = "size"
    return table


def ratio_table(bench, native: str = "torch"):
    """busbw of each reference implementation / busbw of ``native``, per op, world size and size."""
    import pandas as pd

    ok = bench[(bench["suite"] == "collectives") & (bench["status"] == "ok")]
    base = ok[ok["impl"] == native][["op", "world_size", "bytes", "busbw_gbps"]]
    mine = ok[ok["impl"].str.startswith("reference")]
    if base.empty or mine.empty:
        return pd.DataFrame()
    merged = mine.merge(base, on=["op", "world_size", "bytes"], suffixes=("", "_native"))
    merged = merged[merged["busbw_gbps_native"] > 0]
    merged["ratio"] = merged["busbw_gbps"] / merged["busbw_gbps_native"]
    return merged[["op", "impl", "world_size", "bytes", "busbw_gbps", "busbw_gbps_native", "ratio"]]


def ratio_summary(ratios):
    """Mean ratio in the 16-64 MiB band per (op, impl, world size), and whether it meets the target."""
    band = ratios[(ratios["bytes"] >= RATIO_BAND[0]) & (ratios["bytes"] <= RATIO_BAND[1])]
    if band.empty:
        return band
    summary = band.groupby(["op", "impl", "world_size"])["ratio"].agg(["mean", "min", "count"]).reset_index()
    summary["meets_0.9"] = summary["mean"] >= RATIO_TARGET
    return summary


def plot_busbw(bench, op: str, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = bench[(bench["suite"] == "collectives") & (bench["op"] == op) & (bench["status"] == "ok")]
    if rows.empty:
        return False
    from harness.records.scaling import impl_colors

    colors = impl_colors(bench["impl"])  # the report-wide colours
    sizes = sorted(rows["world_size"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.8), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], sizes, strict=True):
        for impl, g in rows[rows["world_size"] == n].groupby("impl"):
            g = g.sort_values("bytes")
            ax.plot(g["bytes"], g["busbw_gbps"], marker="o", ms=3, label=impl, color=colors[impl])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {n} ranks ({rows['backend'].iloc[0]})")
        ax.set_xlabel("size S (bytes)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("busbw (GB/s)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def collectives_section(coll, run_dir: Path, md) -> list[str]:
    out = []
    ratios = ratio_table(coll)
    if len(ratios):
        out += ["## Reference vs native (busbw ratio)", "",
                f"Target: reference ring all-reduce ≥ {RATIO_TARGET}× native busbw, mean over "
                f"{human_bytes(RATIO_BAND[0])}–{human_bytes(RATIO_BAND[1])}.", ""]
        summary = ratio_summary(ratios)
        out += [md(summary.set_index("op")) if len(summary) else "_(no sizes in the 16–64 MiB band in this run)_", ""]
    for op in coll["op"].unique():
        out += [f"## {op}: busbw (GB/s) by size", "", md(busbw_table(coll, op), ".4g"), ""]
        if plot_busbw(coll, op, run_dir / f"busbw_{op}.png"):
            out += [f"![{op} busbw](busbw_{op}.png)", ""]
    unsupported = coll[coll["status"] == "unsupported"]
    if len(unsupported):
        out += ["## Unsupported (reported, not emulated)", "",
                md(unsupported.groupby(["impl", "op"])["detail"].first().to_frame()), ""]
    wrong = coll[coll["wrong"].fillna(0) > 0]
    out += ["## Correctness of timed implementations", "",
            f"{len(wrong)} of {len(coll)} timed cases had wrong elements in the exact check."
            + ("" if wrong.empty else "\n\n" + md(wrong.set_index(["impl", "op", "world_size", "bytes"])
                                                  [["wrong", "detail"]])), ""]
    return out


def headlines(bench, link) -> list[str]:
    """The summary's line: the reference-vs-native band ratios, where the run has them."""
    coll = bench[bench["suite"] == "collectives"]
    ratios = ratio_table(coll) if len(coll) else None
    band = ratio_summary(ratios) if ratios is not None and len(ratios) else None
    if band is None or not len(band):
        return []
    text = "; ".join(f"{r['op']} {r['impl']} n={int(r['world_size'])} {r['mean']:.2f}x"
                     for r in band.to_dict("records"))
    return [f"- **Reference vs native collectives** ({link('busbw ratio', 'Reference vs native')}, 16–64 MiB): {text}."]
