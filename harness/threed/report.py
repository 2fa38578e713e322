"""The report section of the 3D benchmark: layouts ranked by measured step time, beside the rank
``paritybench plan`` gives them (its order: 1F1B bubble, then communication, then memory)."""

from __future__ import annotations


def threed_section(rows, run_dir, md) -> list[str]:
    everything = rows[rows["status"] == "ok"].copy()
    plain = (everything["dtype"] == "float32") & ~everything["op"].str.endswith("+clip")
    ok = everything[plain].copy()
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
    return out + _variants(ok, everything[~plain], md)


def _variants(plain, other, md) -> list[str]:
    """bf16 and clip rows (``bench 3d --3d-variants``) beside the plain row of their layout."""
    if not len(other):
        return []
    base = plain.set_index("op")
    table = []
    for _, r in other.iterrows():
        layout = r["op"].removesuffix("+clip")
        if layout not in base.index:
            continue
        state = r["mem_params_bytes"] + r["mem_grads_bytes"] + r["mem_optimizer_bytes"]
        predicted = r["mem_params_predicted"] + r["mem_grads_predicted"] + r["mem_optimizer_predicted"]
        table.append({"layout": layout, "variant": "clip" if r["op"].endswith("+clip") else "bf16",
                      "step_ms": r["time_p50_us"] / 1e3, "vs_plain": r["time_p50_us"] / base.loc[layout, "time_p50_us"],
                      "state_measured": state, "state_predicted": predicted,
                      "state_vs_plain": state / base.loc[layout, "state_measured"]})
    if not table:
        return []
    import pandas as pd

    return ["### Mixed precision and clipping per layout", "",
            "bf16: the GPT in bfloat16 with fp32 masters (predicted state: training_memory with 2-byte weights and "
            "gradients, K = 8 for the fp32 master and SGD momentum); clip: global gradient-norm clipping at 1.0 "
            "(one more all-reduce over tp, pp and dp and a pass over the gradients). vs_plain: the ratio to the "
            "float32 row of the same layout (CPU bfloat16 GEMMs are not faster than float32 ones).", "",
            md(pd.DataFrame(table).sort_values(["variant", "layout"]), ".4g", index=False), ""]
