"""torchtitan's mixture of experts (0.3.x, ``torchtitan.models.common.moe.MoE``: its ``TokenChoiceTopKRouter``,
``RoutedExperts`` = its ``AllToAllTokenDispatcher`` + ``GroupedExperts``, shared experts as its ``FeedForward``)
built from the one-device layer's weights and parallelized by its own code — ``set_moe_sharding_config`` (as
its Qwen3 / DeepSeek-V3 sharding sets every MoE layer) and ``Module.parallelize`` on a ``ParallelDims`` of
``dp_shard`` = the group's ranks and ``ep`` — on a CPU with gloo (the two import patches of
``torchtitan_import``; nothing else is changed).

What torchtitan defines, read in its source (``models/common/moe.py``, 0.3.0):
- its grouped experts compute in **bfloat16** whatever the parameters' dtype (``GroupedExperts.forward`` casts
  the tokens and the three weights for ``torch._grouped_mm``, the output back): the comparison is
  precision-matched — against torchtitan's own layer on one device, the same recipe;
- its router computes the gate under ``torch.autocast(float32)`` (on a CPU autocast refuses float32 and does
  nothing: the gate runs in the parameters' dtype), then softmax or sigmoid; the top-k weights renormalised
  with + 1e-20 when ``route_norm``; a sigmoid router chooses by scores + its ``expert_bias_E`` buffer (loaded
  from the layer's selection bias; torchtitan moves it in an optimizer pre-step hook, a trainer's, not run here);
- it has **no load-balancing loss** (auxiliary-loss-free balancing by the bias only): the layer returns a zero
  loss and the one-device oracle adds none;
- the experts' gradients are reduced over their expert-data-parallel ranks by FSDP in its trainer, the router's
  over every rank: ``full_grads`` does both (as Megatron's adapter does), the experts gathered from their EP
  shards (DTensor ``Shard(0)`` over ``ep``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.contracts import Unsupported


def titan_moe(dense, dtype=torch.float32, ep_enabled: bool = False):
    """torchtitan's ``MoE`` module with ``dense``'s weights (full, not yet parallelized), in ``dtype``."""
    from harness.adapters.torchtitan.imports import import_torchtitan

    import_torchtitan()  # before any torchtitan module: its patches
    from torch.distributed.tensor import Shard
    from torchtitan.models.common.config_utils import (
        make_ffn_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.common.moe_sharding import set_moe_sharding_config

    E, hidden, ffn = dense.num_experts, dense.router.in_features, dense.experts[0].gate.out_features
    shared = None
    if dense.shared is not None:
        shared = make_ffn_config(dim=hidden, hidden_dim=dense.shared.gate.out_features, w1_param_init={},
                                 w2w3_param_init={})
    cfg = make_moe_config(
        num_experts=E, shared_experts=shared,
        router=make_router_config(dim=hidden, num_experts=E, gate_param_init={}, top_k=dense.top_k,
                                  score_func=dense.scoring, route_norm=dense.renormalize),
        routed_experts=make_routed_experts_config(dim=hidden, hidden_dim=ffn, num_experts=E, top_k=dense.top_k,
                                                  param_init={}, comm_backend="standard"),
        load_balance_coeff=1e-3 if dense.scoring == "sigmoid" else None)  # a coefficient makes its bias buffer
    set_moe_sharding_config(cfg, enable_ep=ep_enabled, enable_sp=False,
                            expert_param_layout={"w1_EFD": Shard(1), "w2_EDF": Shard(2), "w3_EFD": Shard(1)})
    moe = cfg.build().to(dtype)
    with torch.no_grad():
        moe.router.gate.weight.copy_(dense.router.weight)
        inner = moe.routed_experts.inner_experts
        for e, expert in enumerate(dense.experts):
            inner.w1_EFD[e].copy_(expert.gate.weight)
            inner.w3_EFD[e].copy_(expert.up.weight)
            inner.w2_EDF[e].copy_(expert.down.weight)
        if dense.shared is not None:
            for mine, theirs in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
                getattr(moe.shared_experts, mine).weight.copy_(getattr(dense.shared, theirs).weight)
        if moe.expert_bias_E is not None:
            moe.expert_bias_E.copy_(dense.bias)
    return moe


class OneDevice(torch.nn.Module):
    """torchtitan's layer unparallelized (its local token dispatcher), mapping (T, hidden) -> (y, 0): the
    precision-matched oracle; ``_Sharded`` is the same layer with its expert parallelism."""

    def __init__(self, dense, dtype=torch.float32, ep_enabled: bool = False):
        super().__init__()
        self.moe = titan_moe(dense, dtype, ep_enabled)

    def forward(self, x):
        return self.moe(x.unsqueeze(0)).squeeze(0), x.new_zeros(())


class TorchtitanMoE:
    description = "torchtitan MoE (TokenChoiceTopKRouter, AllToAllTokenDispatcher, GroupedExperts in bf16)"

    def shard(self, dense, group, ep: int | None = None, dtype=torch.float32):
        ep = ep or dist.get_world_size()
        if dense.num_experts % ep:
            raise ValueError(f"the {dense.num_experts} experts do not split evenly over ep = {ep} (torchtitan "
                             "shards its grouped experts' first dimension over the EP mesh).")
        if dense.capacity_factor is not None:
            raise Unsupported("the torchtitan MoE adapter here runs dropless (its standard all-to-all dispatcher).")
        if group not in (None, dist.group.WORLD) and dist.get_world_size(group) != dist.get_world_size():
            raise Unsupported("torchtitan lays its expert-parallel mesh over the whole world (ParallelDims).")
        return _Sharded(dense, ep, dtype)

    def full_grads(self, sharded, group) -> dict:
        return sharded.full_grads()


class _Sharded(OneDevice):
    def __init__(self, dense, ep: int, dtype):
        super().__init__(dense, dtype, ep_enabled=ep > 1)  # imports torchtitan first (titan_moe)
        from torchtitan.config import ParallelismConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils

        from harness.adapters.torchtitan.trainer import SPMD_BACKEND

        n = dist.get_world_size()
        dist_utils.set_spmd_backend(SPMD_BACKEND)  # as its Trainer.__init__ does
        self.dims = ParallelDims.from_config(ParallelismConfig(data_parallel_shard_degree=n, expert_parallel_degree=ep,
                                                               spmd_backend=SPMD_BACKEND), n)
        self.moe.parallelize(self.dims)
        self.ep, self.local = ep, dense.num_experts // ep
        self.ep_rank = self.dims.get_mesh("ep").get_local_rank() if ep > 1 else 0
        self.first = self.ep_rank * self.local
        self.experts = list(range(self.local))  # what the layer case reads: how many experts this rank holds

    def full_grads(self) -> dict:
        """Every gradient under the one-device layer's names: the router's and the shared experts' summed over
        every rank (its FSDP's reduction), each expert's over the ranks holding it (its expert-data-parallel
        ranks). ``titan_grads`` gathers an expert's EP shards, so every rank of an EP group holds that group's
        full expert gradients: summed over all n ranks they count each EP group ep times."""
        out = titan_grads(self.moe)
        for name, g in out.items():
            dist.all_reduce(g)
            if name.startswith("experts."):
                g /= self.ep
        return out


def titan_grads(moe) -> dict:
    """This rank's gradients of torchtitan's ``moe`` under the one-device layer's names (DTensors made full)."""
    def grad(p):
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        return (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()

    out = {"router.weight": grad(moe.router.gate.weight)}
    inner = moe.routed_experts.inner_experts
    w1, w3, w2 = grad(inner.w1_EFD), grad(inner.w3_EFD), grad(inner.w2_EDF)
    for e in range(len(w1)):
        out.update({f"experts.{e}.gate.weight": w1[e], f"experts.{e}.up.weight": w3[e],
                    f"experts.{e}.down.weight": w2[e]})
    if moe.shared_experts is not None:
        for mine, theirs in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            out[f"shared.{theirs}.weight"] = grad(getattr(moe.shared_experts, mine).weight)
    return out
