"""The tensor-parallel report section: forward + backward per layer, bytes counted vs the cost model."""

from __future__ import annotations


def tensor_parallel_section(tp, run_dir, md) -> list[str]:
    ok = tp[tp["status"] == "ok"].copy()
    ok["time_p50_ms"] = ok["time_p50_us"] / 1e3
    return ["## Tensor parallel: forward + backward per layer", "",
            "Bytes each rank sends in one step, counted where the implementation calls torch.distributed's "
            "collectives (ours, megatron-core; DTensor's functional collectives are not seen: blank), against "
            "cost_model (one all-reduce of the activations per column, row or embedding layer, two per MLP or "
            "attention block; the LM head adds its cross-entropy's three per-token all-reduces).", "",
            md(ok[["world_size", "op", "impl", "time_p50_ms", "comm_bytes_measured", "comm_bytes_predicted"]],
               ".4g", index=False), ""]
