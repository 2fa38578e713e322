"""The MoE family's feed-forward inside the reference stack (``reference.stack.dimensions.expert_parallel``): one
module per block, on every rank of a (pp, tp) coordinate, its experts split over the EP group — EP groups of
``ep`` consecutive ranks of each data x context parallel group, the expert-data-parallel group one EP rank
across them (``reference.stack.topology.layout``) — or, without EP, all of them.

The sequence-wise balance loss (``reference.models.moe_llama``) enters the backward where it is computed
(``AttachAux``, Megatron's MoEAuxLossAutoScaler): a pipeline stage's layers add their own terms, whatever the
micro-batch, and the trainer never carries a second loss through the schedule. Its weight per step
(``aux_weight``) is aux_coef x cp / the replica's rows (x the loss scale): the trainer averages gradients over
dp x cp, so a replica's rows each count 1 / (its rows), and under cp each rank back-propagates only its own
tokens' share of a sequence's sums (``SumForwardIdentityBackward``): cp of them make the whole. The loss's
value comes back through ``sink``: each backward appends the sum over its micro-batch's sequences."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ..models.moe import route, routed_sum, row_balance, row_balance_loss
from .moe import SumForwardIdentityBackward, check_split, dispatch_combine


class AttachAux(torch.autograd.Function):
    """forward: y unchanged; backward: y's gradient, and ``weight`` as the balance loss's — appending the
    loss's value to ``sink`` once per backward (recomputation reruns forward, never backward)."""

    @staticmethod
    def forward(ctx, y, aux, weight: float, sink: list):
        ctx.weight, ctx.sink, ctx.value = weight, sink, aux.detach().clone()
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.sink.append(ctx.value)
        return grad, torch.full_like(ctx.value, ctx.weight), None, None


class StackMoE(nn.Module):
    """forward(x (b, s, h): this rank's tokens) -> the routed experts' weighted sum + the shared experts."""

    def __init__(self, dense, ep_group=None, cp_group=None, **planted):
        super().__init__()
        E = dense.num_experts
        ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        check_split(E, ep)
        self.ep_group, self.cp_group, self.planted = ep_group, cp_group, planted
        self.num_experts, self.top_k, self.scoring, self.renormalize = E, dense.top_k, dense.scoring, dense.renormalize
        self.router, self.shared = copy.deepcopy(dense.router), copy.deepcopy(dense.shared)
        self.register_buffer("bias", dense.bias.detach().clone(), persistent=False)
        local = E // ep
        self.first = (dist.get_rank(ep_group) if ep_group is not None else 0) * local
        self.experts = nn.ModuleList(copy.deepcopy(dense.experts[self.first + i]) for i in range(local))
        if ep > 1:  # what the trainer reduces over the expert-data-parallel group, and the state's names
            for i, expert in enumerate(self.experts):
                for p in expert.parameters():
                    p.expert_of = (i, self.first + i)
        self.aux_weight, self.sink = 0.0, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        weights, experts, balance = route(self.router(flat), self.top_k, self.scoring, self.renormalize, self.bias)
        if self.ep_group is not None:
            y = dispatch_combine(flat, weights, experts, self.experts, self.first, self.ep_group)[0]
        else:
            y = routed_sum(flat, weights, experts, self.experts)
        if self.shared is not None:
            y = y + self.shared(flat)
        counts, psum = row_balance(balance, experts, b, self.num_experts)
        tokens = s
        if self.cp_group is not None and not self.planted.get("aux_per_shard"):  # a sequence's sums over its ranks
            dist.all_reduce(counts, group=self.cp_group)
            psum = SumForwardIdentityBackward.apply(psum, self.cp_group)
            tokens = s * dist.get_world_size(self.cp_group)
        aux = row_balance_loss(counts, psum, tokens, self.top_k).sum()
        return AttachAux.apply(y, aux, self.aux_weight, self.sink).view(b, s, h)
