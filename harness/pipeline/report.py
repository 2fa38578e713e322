"""The pipeline's report section: step time per schedule, and our runtime's bubble measured vs simulated."""

from __future__ import annotations

from pathlib import Path


def pipeline_section(pipe, run_dir: Path, md) -> list[str]:
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
        out += ["Step time p50 (ms):", "", md(table.reset_index(), ".2f", index=False), ""]
        bub = ok.dropna(subset=["bubble_measured"])
        if len(bub):
            cols = ["world_size", "op", "microbatches", "bubble_measured", "bubble_predicted", "time_p50_us",
                    "makespan_predicted_us"]
            out += ["Bubble of our runtime, measured vs simulated:", "", md(bub[cols], ".3f", index=False), ""]
        held = ok.dropna(subset=["peak_activations_measured", "peak_activations_simulated"]) \
            if "peak_activations_measured" in ok else ok.iloc[0:0]
        if len(held):
            same = int((held["peak_activations_measured"] == held["peak_activations_simulated"]).sum())
            cols = ["world_size", "op", "microbatches", "peak_activations_measured", "peak_activations_simulated"]
            out += [f"Peak stage activations a rank held at once (most over ranks), counted on our runtime's own "
                    f"tensors vs the simulator's: equal in {same} of {len(held)} rows (the order on a rank fixes "
                    "it; 1F1B holds p, ZB-V 2p half-size stages, DualPipeV 2p + 1, DeepSeek's PP + 1).", "",
                    md(held[cols].astype({c: int for c in cols[3:]}), "d", index=False), ""]
            for _, r in bub.iterrows():
                stem = f"pipeline_{r['impl']}_{r['op']}_p{r['world_size']}_m{r['microbatches']}"
                if (run_dir / f"{stem}_measured.png").exists():
                    out += [f"![{stem} measured]({stem}_measured.png) ![{stem} simulated]({stem}_simulated.png)", ""]
    unsupported = pipe[pipe["status"] == "unsupported"]
    if len(unsupported):
        out += ["Unsupported (reported, not emulated):", "",
                md(unsupported.set_index(["impl", "op", "world_size", "microbatches"])[["detail"]]), ""]
    return out
