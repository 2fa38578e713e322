"""``ExpertParallelMoE``: the MoE layer over an EP group (see the package's docstring for the layout, the
dispatch and the gradient derivation)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ..models.moe import balance_loss, kept_assignments, route

_GROUPS: dict = {}


def ep_groups(n: int, ep: int, rank: int) -> tuple:
    """(this rank's EP group, its expert-data-parallel group), created collectively once per (n, ep) and
    process: every rank creates every group, in the same order."""
    if (n, ep) not in _GROUPS:
        mine = {}
        for g in range(n // ep):  # EP groups: consecutive ranks
            ranks = list(range(g * ep, (g + 1) * ep))
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["ep"] = group
        for j in range(ep):  # expert-data-parallel groups: one EP rank across the EP groups
            ranks = list(range(j, n, ep))
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["edp"] = group
        _GROUPS[(n, ep)] = (mine["ep"], mine["edp"])
    return _GROUPS[(n, ep)]


def check_split(experts: int, ep: int) -> None:
    """One sentence for experts that do not split evenly over the EP group."""
    if experts % ep:
        raise ValueError(f"the {experts} experts do not split evenly over ep = {ep}: each EP rank holds E / ep of "
                         f"them; choose an ep that divides {experts}.")


class AllToAllV(torch.autograd.Function):
    """forward: rows of x split by ``send`` to the EP ranks, the rows each sends here (``recv``) returned;
    backward: the same exchange reversed (the gradient rows go back where they came from)."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class SumForwardIdentityBackward(torch.autograd.Function):
    """forward: all-reduce (sum) over ``group``; backward: identity — each rank's share of a global scalar,
    made the global value everywhere while its gradient stays with its own share."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def dispatch_combine(x, weights, experts, local_experts, first: int, ep_group, combine_dispatched: bool = False,
                     kept: torch.Tensor | None = None):
    """The routed experts' weighted sum for this rank's tokens x (T, hidden), its experts ``local_experts``
    (global ids ``first`` ...) over ``ep_group``: count the (token, slot) assignments per destination EP rank,
    exchange the counts, then the rows and their expert ids (variable splits: a rank may send or receive
    nothing), run each local expert on the rows it received, send the outputs back, combine each into its
    token weighted by its routing weight. Returns (y, (sent, received) assignments per EP rank, (the rows this
rank received, the token each sent row came from)). ``kept``: the (token, slot) assignments a capacity keeps
(None: every one); the others are never sent."""
    ep, local = dist.get_world_size(ep_group), len(local_experts)
    tokens = torch.arange(len(x), device=x.device)[:, None].expand_as(experts).flatten()
    flat_experts, flat_weights = experts.flatten(), weights.flatten()
    if kept is not None:  # a capacity's dropped assignments are never sent
        keep = kept.flatten()
        tokens, flat_experts, flat_weights = tokens[keep], flat_experts[keep], flat_weights[keep]
    order = torch.argsort(flat_experts // local, stable=True)  # by destination EP rank
    tokens, flat_experts, flat_weights = tokens[order], flat_experts[order], flat_weights[order]
    send = torch.bincount(flat_experts // local, minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ep_group)  # the counts first
    send_l, recv_l = send.tolist(), recv.tolist()
    rows = AllToAllV.apply(x[tokens], send_l, recv_l, ep_group)
    ids = _exchange(flat_experts[:, None].to(torch.int64), send_l, recv_l, ep_group)[:, 0]
    # rows x 0, not zeros: the outputs stay in the graph of the received rows even where no expert runs
    # (a rank that receives nothing), so every rank takes part in both all-to-alls' backward
    out = rows * 0.0
    for i, expert in enumerate(local_experts):
        mine = torch.nonzero(ids == first + i, as_tuple=True)[0]
        if len(mine):
            out = out.index_copy(0, mine, expert(rows[mine]))
    back = AllToAllV.apply(out, recv_l, send_l, ep_group)
    combine_at = torch.arange(len(tokens), device=x.device) % len(x) if combine_dispatched \
        else tokens  # planted: the dispatched rows' positions taken as token ids
    y = torch.zeros_like(x).index_add(0, combine_at, flat_weights[:, None] * back)
    return y, (send_l, recv_l), (rows, tokens)


class ExpertParallelMoE(nn.Module):
    """forward(x (T_local, hidden)) -> (this rank's rows of the dense layer's output, the load-balancing loss
    over the whole group's tokens). ``planted``: the bugs the suite plants (each a keyword)."""

    def __init__(self, dense, group, ep: int | None = None, **planted):
        super().__init__()
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        ep = ep or n
        E = dense.num_experts
        if n % ep:
            raise ValueError(f"ep ({ep}) must divide the group's {n} ranks.")
        check_split(E, ep)
        if n != dist.get_world_size():
            raise NotImplementedError("the reference expert parallelism lays its EP groups over the default group.")
        self.group, self.n, self.ep, self.planted = group, n, ep, planted
        self.ep_group, self.edp_group = ep_groups(n, ep, dist.get_rank())
        self.ep_rank, self.local = rank % ep, E // ep
        self.num_experts, self.top_k = E, dense.top_k
        self.scoring, self.capacity_factor = dense.scoring, dense.capacity_factor
        self.renormalize = dense.renormalize and not planted.get("not_renormalized")
        self.router, self.shared = copy.deepcopy(dense.router), copy.deepcopy(dense.shared)
        self.register_buffer("bias", dense.bias.detach().clone() * (0.0 if planted.get("bias_ignored") else 1.0))
        first = self.ep_rank * self.local
        self.experts = nn.ModuleList(copy.deepcopy(dense.experts[first + i]) for i in range(self.local))
        self.first = first

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, experts, balance = route(self.router(x), self.top_k, self.scoring, self.renormalize, self.bias)
        # capacity: each expert takes the first ceil(factor T k / E) of this rank's own assignments (the rule of
        # the one-device layer, applied to the tokens this rank holds); planted: over every assignment
        factor = None if self.planted.get("capacity_ignored") else self.capacity_factor
        kept = kept_assignments(experts, self.num_experts, factor) if factor is not None else None
        y, self.last_counts, dispatched = dispatch_combine(
            x, weights, experts, self.experts, self.first, self.ep_group,
            combine_dispatched=bool(self.planted.get("combine_dispatched")), kept=kept)
        if self.shared is not None:  # on this rank's own tokens (planted: on the dispatched rows)
            y = y + (self.shared(x) if not self.planted.get("shared_on_dispatched")
                     else _shared_on_dispatched(self.shared, x, *dispatched))
        return y, self._aux(balance, experts, len(x))

    def _aux(self, balance, experts, tokens: int) -> torch.Tensor:
        """E x sum_i f_i P_i over the whole group's tokens: the counts and the token total all-reduced (no
        gradient), this rank's share of P_i's sum made the global value by ``SumForwardIdentityBackward``."""
        if self.planted.get("aux_local"):  # planted: over this rank's tokens only
            return balance_loss(balance, experts, self.num_experts)
        E = self.num_experts
        counts = torch.bincount(experts.flatten(), minlength=E).to(balance.dtype)
        total = torch.tensor([float(tokens)], dtype=balance.dtype, device=balance.device)
        dist.all_reduce(counts, group=self.group)
        dist.all_reduce(total, group=self.group)
        f = counts / (total * self.top_k)
        share = E * (f * balance.sum(0) / total).sum()
        return SumForwardIdentityBackward.apply(share, self.group)


def _shared_on_dispatched(shared, x, rows, tokens):
    """Planted: the shared expert run on the dispatched rows (this rank's received tokens), added back at
    the sending positions — a token counted once per routed slot, and the wrong tokens across ranks."""
    y = torch.zeros_like(x)
    take = min(len(rows), len(tokens))
    return y.index_add(0, tokens[:take], shared(rows[:take]))


def full_grads(module: ExpertParallelMoE, group, **planted) -> dict[str, torch.Tensor]:
    """Every gradient under the dense layer's names, on every rank (collective): the router and the shared
    experts summed over the group; each expert summed over its expert-data-parallel group, then handed to
    every rank of its EP group (each EP rank contributes its own experts)."""
    out = {}
    for name, p in module.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        if name.startswith("experts."):
            local, rest = name.split(".", 2)[1:]
            if planted.get("experts_over_whole_group"):  # planted: slot by slot over the whole group
                dist.all_reduce(g, group=group)
            elif not planted.get("experts_not_reduced"):
                dist.all_reduce(g, group=module.edp_group)
            if planted.get("experts_divided_by_edp"):
                # planted: a trainer dividing the expert sum by the expert-data-parallel size n / ep where dense
                # parameters take n — in this sum-of-losses contract, ep times the sum (pytorch #160285's 2x)
                g = g * module.ep
            out[f"experts.{module.first + int(local)}.{rest}"] = g
        else:
            if not (planted.get("router_not_reduced") and name.startswith("router.")):
                dist.all_reduce(g, group=group)
            out[name] = g
    return with_every_expert(out, module.ep_group, next(module.parameters()).device)


def with_every_expert(grads: dict, ep_group, device) -> dict:
    """``grads`` (this rank's experts' under their global names, the rest) completed with every other EP rank's
    experts (collective over ``ep_group``)."""
    everyone = [None] * dist.get_world_size(ep_group)
    dist.all_gather_object(everyone, {k: v.cpu() for k, v in grads.items() if k.startswith("experts.")},
                           group=ep_group)
    for part in everyone:
        for k, v in part.items():
            grads.setdefault(k, v.to(device))
    return grads


class ReferenceExpertParallel:
    """The ``expert_parallel`` contract over ``ExpertParallelMoE``."""

    description = "ours: all-to-all dispatch with variable splits, expert-data-parallel reduction"

    def __init__(self, **planted):
        self.planted = planted

    def shard(self, dense_moe, group, ep: int | None = None):
        return ExpertParallelMoE(dense_moe, group, ep, **self.planted)

    def full_grads(self, sharded, group) -> dict:
        return full_grads(sharded, group, **self.planted)
