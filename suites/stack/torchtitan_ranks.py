"""Rank side of the torchtitan watch tests outside the stack: what its context parallelism and its MoE
experts do on this machine (``suites/context_parallel/test_third_party.py``,
``suites/expert_parallel/test_third_party.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def torchtitan_cp_probe() -> tuple[str, str]:
    """torchtitan's context parallelism (``apply_cp_to_forward`` on its SDPA core: q, k, v wrapped as
    sequence-sharded DTensors, torch's context-parallel dispatcher) on a causal (1, 8, 2, 4) float32 attention
    over the World: ("ran", "") or (exception type, its first line)."""
    from torch.distributed.device_mesh import init_device_mesh

    from harness.adapters.torchtitan.imports import import_torchtitan

    import_torchtitan()
    from torchtitan.distributed.context_parallel.api import apply_cp_to_forward
    from torchtitan.models.common.attention import ScaledDotProductAttention

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    attn = ScaledDotProductAttention(ScaledDotProductAttention.Config())
    apply_cp_to_forward([attn], mesh)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8 // dist.get_world_size(), 2, 4) for _ in range(3))  # (B, L, N, H) shards
    try:
        attn(q, k, v)
        return "ran", ""
    except Exception as exc:  # noqa: BLE001 - what it raises is the observation
        return type(exc).__name__, str(exc).splitlines()[0][:200]


def torchtitan_experts_error() -> dict:
    """torchtitan's ``GroupedExperts`` (two SwiGLU experts, float64 weights and tokens) against the same
    experts computed in float64: {"dtype": the output's, "rel": the largest difference / the largest
    magnitude} — or {"raised": ...} where its grouped GEMM does not run here."""
    from harness.adapters.torchtitan.imports import import_torchtitan

    import_torchtitan()
    from torchtitan.models.common.moe import GroupedExperts

    torch.manual_seed(0)
    experts = GroupedExperts(GroupedExperts.Config(dim=8, hidden_dim=16, num_experts=2)).double()
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.5)
    x, counts = torch.randn(6, 8, dtype=torch.float64), torch.tensor([4, 2])
    try:
        got = experts(x, counts)
    except Exception as exc:  # noqa: BLE001
        return {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    want = []
    for e, rows in enumerate(x.split(counts.tolist())):
        h = torch.nn.functional.silu(rows @ experts.w1_EFD[e].T) * (rows @ experts.w3_EFD[e].T)
        want.append(h @ experts.w2_EDF[e].T)
    want = torch.cat(want)
    return {"dtype": str(got.dtype), "rel": float((got - want).abs().max() / want.abs().max())}
