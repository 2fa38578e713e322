"""``paritybench report RUN_DIR``: report.md (pandas tables) and PNG plots, from CSV/JSON only."""

from __future__ import annotations

from pathlib import Path

from .results import read_run

# The reference/native target the foundation issue sets: ring all-reduce busbw >= 0.9x gloo's at 16-64 MiB.
RATIO_BAND = (16 << 20, 64 << 20)
RATIO_TARGET = 0.9


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{int(n)} B"


def _md(df, floatfmt=".3f", index=True) -> str:
    return df.to_markdown(floatfmt=floatfmt, index=index) if len(df) else "_(no rows)_"


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
    from .scaling import impl_colors

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


def pipeline_section(pipe, run_dir: Path) -> list[str]:
    """Step time per implementation x schedule x (p, m); our runtime's bubble, measured vs simulated."""
    ok = pipe[pipe["status"] == "ok"].astype({"microbatches": int, "world_size": int})
    out = ["## Pipeline: step time and bubble", "",
           f"Pipeline ranks measured here: {sorted(set(pipe['world_size']))} "
           "(on 2 CPU cores only p = 2 is meaningful; p >= 4 is for GPU nodes). The bubble is measured from "
           "our runtime's per-action timestamps and predicted by simulating the same schedule with the "
           "measured mean cost of each action kind and the measured hop latency.", ""]
    if len(ok):
        ok["step_ms"] = ok["time_p50_us"] / 1e3
        table = ok.pivot_table(index=["world_size", "op", "microbatches"], columns="impl", values="step_ms",
                               aggfunc="first")
        out += ["Step time p50 (ms):", "", _md(table.reset_index(), ".2f", index=False), ""]
        bub = ok.dropna(subset=["bubble_measured"])
        if len(bub):
            cols = ["world_size", "op", "microbatches", "bubble_measured", "bubble_predicted", "time_p50_us",
                    "makespan_predicted_us"]
            out += ["Bubble of our runtime, measured vs simulated:", "", _md(bub[cols], ".3f", index=False), ""]
            for _, r in bub.iterrows():
                stem = f"pipeline_{r['impl']}_{r['op']}_p{r['world_size']}_m{r['microbatches']}"
                if (run_dir / f"{stem}_measured.png").exists():
                    out += [f"![{stem} measured]({stem}_measured.png) ![{stem} simulated]({stem}_simulated.png)", ""]
    unsupported = pipe[pipe["status"] == "unsupported"]
    if len(unsupported):
        out += ["Unsupported (reported, not emulated):", "",
                _md(unsupported.set_index(["impl", "op", "world_size", "microbatches"])[["detail"]]), ""]
    return out


def _sections_table(meta: dict) -> list[str]:
    """Wall time per section of the run (``bench_cli.run_plans``: each sweep, its World start-up included)."""
    import pandas as pd

    sections = meta.get("sections") or []
    if not sections:
        return []
    frame = pd.DataFrame(sections)
    frame = frame.groupby("section", sort=False)["seconds"].sum().to_frame()  # bench all's stack runs once a stack
    total = float(frame["seconds"].sum())
    frame["share"] = frame["seconds"] / total
    return ["## Time per section", "", f"Wall seconds of each section of this run, {total:.0f} s in all "
            "(the report itself is timed after it: `report_seconds` in run.json).", "", _md(frame, ".3g"), ""]


def write_report(run_dir, baseline=None) -> Path:
    """Write ``report.md`` (and ``busbw_<op>.png`` plots, ``scaling.csv``) into the run folder; return its path.
    With ``baseline`` (a run folder or merged baseline) the report opens with the gate's comparison."""
    run_dir = Path(run_dir)
    meta, frames = read_run(run_dir)
    bench, conf = frames["benchmarks.csv"], frames["conformance.csv"]
    out = [f"# paritybench report — run {meta.get('run_id')}", ""]
    if meta.get("status") != "complete":
        out += [f"> **This run is {meta.get('status', 'unknown')}**: it stopped before the end; "
                "the tables show the rows it finished.", ""]
    env = {k: meta.get(k) for k in ("command", "started", "finished", "backend", "python", "torch",
                                    "cpu", "cpu_count", "gpus", "host", "git_revision", "launcher", "nodes")
           if meta.get(k)}
    if baseline is not None:
        from .gate.report import comparison_section

        out += comparison_section(str(baseline), run_dir)
    out += ["## Where it ran", "", *[f"- **{k}**: `{v}`" for k, v in env.items()]]
    for size, info in sorted(meta.get("placement", {}).items(), key=lambda kv: int(kv[0])):
        if not info.get("ranks"):
            continue
        per_host = {}
        for r in info["ranks"]:
            per_host.setdefault((r["node"], r["host"]), []).append(str(r["rank"]))
        hosts = "; ".join(f"node {node} `{host}`: ranks {','.join(ranks)}" for (node, host), ranks in per_host.items())
        out.append(f"- **world {size}**: {hosts} ({info['ranks'][0]['device'].split(':')[0]})")
    out.append("")
    out += _sections_table(meta)
    dispatch = bench[bench["suite"] == "world"] if len(bench) else bench
    if len(dispatch):
        out += ["## World dispatch overhead (warm no-op `World.run`, µs)", "",
                _md(dispatch.astype({"iters": str}).set_index("world_size")[
                    ["iters", "time_p50_us", "time_p95_us", "time_min_us", "time_max_us", "time_cv"]], ".2f"), ""]
    coll = bench[bench["suite"] == "collectives"] if len(bench) else bench
    band = None
    if len(coll):
        ratios = ratio_table(coll)
        if len(ratios):
            out += ["## Reference vs native (busbw ratio)", "",
                    f"Target: reference ring all-reduce ≥ {RATIO_TARGET}× native busbw, mean over "
                    f"{human_bytes(RATIO_BAND[0])}–{human_bytes(RATIO_BAND[1])}.", ""]
            summary = band = ratio_summary(ratios)
            out += [_md(summary.set_index("op")) if len(summary)
                    else "_(no sizes in the 16–64 MiB band in this run)_", ""]
        for op in coll["op"].unique():
            out += [f"## {op}: busbw (GB/s) by size", "", _md(busbw_table(coll, op), ".4g"), ""]
            if plot_busbw(coll, op, run_dir / f"busbw_{op}.png"):
                out += [f"![{op} busbw](busbw_{op}.png)", ""]
        unsupported = coll[coll["status"] == "unsupported"]
        if len(unsupported):
            out += ["## Unsupported (reported, not emulated)", "",
                    _md(unsupported.groupby(["impl", "op"])["detail"].first().to_frame()), ""]
        wrong = coll[coll["wrong"].fillna(0) > 0]
        out += ["## Correctness of timed implementations", "",
                f"{len(wrong)} of {len(coll)} timed cases had wrong elements in the exact check."
                + ("" if wrong.empty else "\n\n" + _md(wrong.set_index(["impl", "op", "world_size", "bytes"])
                                                       [["wrong", "detail"]])), ""]
    tp = bench[bench["suite"] == "tensor_parallel"] if len(bench) else bench
    if len(tp):
        ok = tp[tp["status"] == "ok"].copy()
        ok["time_p50_ms"] = ok["time_p50_us"] / 1e3
        out += ["## Tensor parallel: forward + backward per layer", "",
                "Bytes each rank sends in one step, counted where the implementation calls torch.distributed's "
                "collectives (ours, megatron-core; DTensor's functional collectives are not seen: blank), against "
                "cost_model (one all-reduce of the activations per column, row or embedding layer, two per MLP or "
                "attention block; the LM head adds its cross-entropy's three per-token all-reduces).", "",
                _md(ok[["world_size", "op", "impl", "time_p50_ms", "comm_bytes_measured", "comm_bytes_predicted"]],
                    ".4g", index=False), ""]
    zero = bench[bench["suite"] == "zero"] if len(bench) else bench
    if len(zero):
        from .zero.report import zero_section

        out += zero_section(zero, run_dir, _md)
    cpar = bench[bench["suite"] == "context_parallel"] if len(bench) else bench
    if len(cpar):
        from .context_parallel.bench import context_parallel_section

        out += context_parallel_section(cpar, _md)
    epar = bench[bench["suite"] == "expert_parallel"] if len(bench) else bench
    if len(epar):
        from .expert_parallel.bench import expert_parallel_section

        out += expert_parallel_section(epar, _md)
    stack = bench[bench["suite"] == "stack"] if len(bench) else bench
    if len(stack):
        from .stack.report import stack_section

        out += stack_section(stack, _md)
    threed = bench[bench["suite"] == "3d"] if len(bench) else bench
    if len(threed):
        from .threed.report import threed_section

        out += threed_section(threed, _md)
    resume = bench[bench["suite"] == "resume"] if len(bench) else bench
    if len(resume):
        from .resume.bench import resume_section

        out += resume_section(resume, _md)
    ckpt = bench[bench["suite"] == "checkpoint"] if len(bench) else bench
    if len(ckpt):
        from .checkpoint.report import checkpoint_section

        out += checkpoint_section(ckpt, _md)
    pipe = bench[bench["suite"] == "pipeline"] if len(bench) else bench
    if len(pipe):
        out += pipeline_section(pipe, run_dir)
    from .calibrate.report import calibration_section, planner_section

    if len(bench):
        out += planner_section(bench, run_dir, _md)
    out += calibration_section(frames["calibration.csv"], meta, run_dir, _md)
    if len(bench):
        from .scaling import scaling_section

        out += scaling_section(bench, run_dir, _md)
    if len(conf):
        from .stack.report import stack_matrix_section

        out += stack_matrix_section(conf, _md)
        counts = conf.groupby(["impl", "outcome"]).size().unstack(fill_value=0)
        out += ["## Conformance rows", "", _md(counts, "g"), ""]
    from .report_summary import summary as first_screen

    head = 3 if meta.get("status") != "complete" else 1  # the title, and the incomplete-run warning
    out[head + 1:head + 1] = first_screen(meta, bench, conf, out, band)
    path = run_dir / "report.md"
    path.write_text("\n".join(out))
    return path
