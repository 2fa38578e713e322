"""The report section of the 3D benchmark: layouts ranked by measured step time, beside the rank
``paritybench plan`` gives them (its order: 1F1B bubble, then communication, then memory)."""

from __future__ import annotations


def threed_section(rows, md) -> list[str]:
    ok = rows[rows["status"] == "ok"].copy()
    out = ["## 3D layouts: measured beside predicted", "",
           "Every dp x pp x tp layout of the same GPT (reference composition; "
           f"{ok['detail'].iloc[0] if len(ok) else ''}), one world size. Ranks oversubscribe the CPU cores: "
           "the step times rank layouts against each other, not against a machine. Model state per rank: the largest "
           "rank, measured; predicted: training_memory in float32 / SGD-momentum terms (even tp x pp split). "
           "Bubble: measured from the runtime's action timestamps; predicted: plan's 1F1B bubble.", ""]
    if not len(ok):
        return out + ["_(no successful rows)_", ""]
    ok["step_ms"] = ok["time_p50_us"] / 1e3
    ok["state_measured"] = ok["mem_params_bytes"] + ok["mem_grads_bytes"] + ok["mem_optimizer_bytes"]
    ok["state_predicted"] = ok["mem_params_predicted"] + ok["mem_grads_predicted"] + ok["mem_optimizer_predicted"]
    ok["rank_measured"] = ok["step_ms"].rank(method="min").astype(int)
    ok = ok.sort_values(["bubble_predicted", "comm_bytes_predicted", "state_predicted"], na_position="last")
    ok["rank_predicted"] = range(1, len(ok) + 1)
    cols = ["op", "rank_measured", "rank_predicted", "step_ms", "bubble_measured", "bubble_predicted",
            "comm_bytes_predicted", "state_measured", "state_predicted"]
    out += ["Layout = dp x pp x tp.", "", md(ok.sort_values("rank_measured")[cols], ".4g", index=False), ""]
    return out
