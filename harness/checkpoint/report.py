"""The report section of the checkpointing benchmark: peak activation memory and step time per layer
count, measured beside cost_model — the claims "activation memory down to about sqrt(L) layers" and
"+~30 % compute" checked against the measurement."""

from __future__ import annotations

from harness.records.tables import NO_ROWS, opening


def checkpoint_section(ckpt, run_dir, md) -> list[str]:
    ok, out = opening(ckpt, "## Activation checkpointing: peak activation memory and step time",
                      "A stack of L Linear-GELU layers (float32), one process. Peak activation memory = bytes of "
                      "tensors saved for backward, alive at once (saved-tensor hooks; parameters excluded), over "
                      "forward and backward. Predicted (cost_model, Chen et al. convention: a kept segment input "
                      "counts as one layer's activations, here it is half of them): none L, per-layer L + 1, sqrt "
                      "ceil(L/k) + k layers at k ~ sqrt(L). Compute: measured step time / no checkpointing - 1 beside "
                      "recompute_overhead (+1/3).")
    if not len(ok):
        return out + NO_ROWS
    ok = ok.astype({"count": int})
    ok["memory_vs_none"] = ok["act_peak_bytes"] / ok.groupby("count")["act_peak_bytes"].transform("max")
    ok["predicted_vs_none"] = ok["act_peak_predicted"] / (ok["count"] * ok["act_peak_predicted"].where(
        ok["op"] == "none").groupby(ok["count"]).transform("max") / ok["count"])
    ok["step_ms"] = ok["time_p50_us"] / 1e3
    cols = ["count", "impl", "op", "act_peak_bytes", "act_peak_predicted", "memory_vs_none", "predicted_vs_none",
            "step_ms", "recompute_overhead_measured", "recompute_overhead_predicted"]
    out += [md(ok.sort_values(["count", "op", "impl"])[cols], ".3g", index=False), ""]
    return out
