"""DeepSpeed's mixture of experts (``deepspeed.moe.layer.MoE``: ``TopKGate`` + ``MOELayer``'s all-to-all
dispatch over its expert-parallel group, ``Experts``) built from the one-device layer's weights.

What DeepSpeed defines differently from the expert-parallel contract — read in its source
(``deepspeed/moe/sharded_moe.py``, 0.19) and held in ``suites/expert_parallel/test_third_party.py``:
- the gate computes in float32 whatever the model's dtype (``TopKGate.forward``: ``input.float()``, the
  router's weight ``.float()``): the comparison runs in float32;
- top-1 weights each token's expert by its probability (our ``renormalize=False``); top-2 by the two
  probabilities renormalised; only k = 1, 2 (``topkgating`` serves k > 2 through another path);
- ``l_aux`` is over **this rank's tokens** (not the group's), and for top-2 counts each token's **first**
  choice only: E^2 mean_i(P_i c1_i) with c1_i the fraction of first choices — top-1: E sum_i P_i f_i, the
  Switch form;
- capacity (``drop_tokens=True``): ceil(T / E x capacity_factor x k) slots per expert (at least
  ``min_capacity``), every first choice placed before any second one (``locations2 += sum(mask1)``); the
  adapter runs it dropless (``drop_tokens=False``: capacity = the largest expert count over the EP group);
- the second expert of top-2 is drawn with Gumbel noise by default (``top2_2nd_expert_sampling=True``);
  the adapter turns it off (the argmax of the rest, the contract's top-2);
- the expert-data-parallel reduction is the engine's (not the layer's): ``full_grads`` sums over DeepSpeed's
  own expert-data-parallel group (``groups._get_expert_data_parallel_group``), the router over every rank.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from harness.contracts import Unsupported


class DeepSpeedMoE:
    description = "DeepSpeed MoE: deepspeed.moe.layer.MoE (TopKGate, MOELayer all-to-all) on CPU/gloo"

    def shard(self, dense, group, ep: int | None = None):
        from harness.adapters.deepspeed.init import init

        if dense.scoring != "softmax":
            raise Unsupported("DeepSpeed's TopKGate routes by the softmax only (no sigmoid scores with a bias).")
        if dense.top_k not in (1, 2):
            raise Unsupported("DeepSpeed's MoE layer takes k = 1 or 2 here.")
        if dense.shared is not None:
            raise Unsupported("DeepSpeed has no shared expert (its use_residual is PR-MoE's learned mix of an MLP "
                              "and the experts, another function).")
        if (dense.top_k == 1) == dense.renormalize:
            raise Unsupported("DeepSpeed weights a top-1 expert by its probability and renormalises top-2's two: "
                              f"renormalize={dense.renormalize} at k = {dense.top_k} is not what it computes.")
        readers = expert_group_readers()  # before any group is built: unsupported where DeepSpeed has no such readers
        n = dist.get_world_size(group)
        ep = ep or n
        if n != dist.get_world_size():
            raise Unsupported("DeepSpeed lays its expert groups over the whole world.")
        init()
        return _Layer(dense, ep, readers)

    def full_grads(self, sharded, group) -> dict:
        return sharded.full_grads(group)


def expert_group_readers() -> tuple:
    """DeepSpeed's readers of an MoE layer's expert-data-parallel and expert-parallel groups by the layer's group name
    — private (``deepspeed.utils.groups._get_expert_data_parallel_group`` / ``_get_expert_parallel_group``: its
    engine reduces the experts' gradients over the former; DeepSpeed has no public reader). Where this DeepSpeed has
    no such callables, unsupported in one sentence (nothing built)."""
    from deepspeed.utils import groups

    readers = (getattr(groups, "_get_expert_data_parallel_group", None),
               getattr(groups, "_get_expert_parallel_group", None))
    if not all(callable(r) for r in readers):
        raise Unsupported("this DeepSpeed has no groups._get_expert_data_parallel_group / "
                          "groups._get_expert_parallel_group: the expert groups its engine reduces over cannot be "
                          "read, so its MoE layer is not held here.")
    return readers


class _Layer(torch.nn.Module):
    def __init__(self, dense, ep: int, readers: tuple):
        from deepspeed.moe.layer import MoE

        super().__init__()
        E = dense.num_experts
        self.moe = MoE(dense.router.in_features, copy.deepcopy(dense.experts[0]), num_experts=E, ep_size=ep,
                       k=dense.top_k, min_capacity=0, drop_tokens=False, use_rts=False,
                       top2_2nd_expert_sampling=False)
        self.moe.set_deepspeed_parallelism()
        edp, ep_of = readers  # what shard() read (expert_group_readers)
        self.edp_group = edp(self.moe.expert_group_name)
        self.ep_group = ep_of(self.moe.expert_group_name)
        local = E // ep
        self.first = dist.get_rank(self.ep_group) * local
        experts = self.moe.deepspeed_moe.experts.deepspeed_experts
        with torch.no_grad():
            self.moe.deepspeed_moe.gate.wg.weight.copy_(dense.router.weight)
            for i, expert in enumerate(experts):
                expert.load_state_dict(dense.experts[self.first + i].state_dict())
        self.experts = experts

    def forward(self, x):
        y, aux, _ = self.moe(x)
        return y, aux

    def full_grads(self, group) -> dict:
        out = {}
        gate = self.moe.deepspeed_moe.gate.wg.weight
        g = gate.grad.detach().clone() if gate.grad is not None else torch.zeros_like(gate)
        dist.all_reduce(g, group=group)
        out["router.weight"] = g
        for i, expert in enumerate(self.experts):
            for name, p in expert.named_parameters():
                g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                dist.all_reduce(g, group=self.edp_group)
                out[f"experts.{self.first + i}.{name}"] = g
        from reference.expert_parallel.moe import with_every_expert

        return with_every_expert(out, self.ep_group, gate.device)
