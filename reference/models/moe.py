"""The mixture-of-experts feed-forward on one device (the MoE family's FFN): a router, E routed SwiGLU experts,
optional shared experts, the load-balancing loss. The oracle of ``reference.expert_parallel``.

Routing, per token (``route``):
- ``softmax`` (Switch / Mixtral / Qwen3-MoE): probabilities p = softmax(router(x)); the top-k experts by p;
  their weights the top-k p, renormalised to sum to 1 when ``renormalize``;
- ``sigmoid`` (DeepSeek-V3's auxiliary-loss-free routing): scores s = sigmoid(router(x)); the top-k experts
  by s + ``bias`` (a per-expert selection bias, a buffer adjusted outside the gradient); their weights the
  top-k s (not s + bias), renormalised when ``renormalize``.
Dropless: every token reaches its k experts. ``capacity_factor`` (optional): each expert takes at most
ceil(factor x T k / E) assignments, in token order (the first tokens routed to it win; a dropped assignment
contributes nothing — its token keeps its other experts and the shared expert).

Load-balancing loss (Switch / GShard form): aux = E x sum_i f_i P_i, over **every token of the batch the
layer is given** (the global token set under expert parallelism): f_i the fraction of the T k assignments
routed to expert i (not differentiable), P_i the mean over the T tokens of expert i's routing probability
(softmax p, or the sigmoid scores normalised per token). Megatron computes it per micro-batch over the
sequence-parallel group's tokens, torchtitan per layer over the local tokens: stacks differ, so the contract
says which (here: the global set)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .llama import SwiGLU

SCORINGS = ("softmax", "sigmoid")


def route(logits: torch.Tensor, k: int, scoring: str = "softmax", renormalize: bool = True,
          bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights (T, k), experts (T, k), the probabilities the load-balancing loss reads (T, E))."""
    if scoring == "softmax":
        probs = torch.softmax(logits, dim=-1)
        weights, experts = probs.topk(k, dim=-1)
        balance = probs
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
        chosen = scores + (bias if bias is not None else 0.0)
        experts = chosen.detach().topk(k, dim=-1).indices
        weights = scores.gather(-1, experts)
        balance = scores / scores.sum(-1, keepdim=True)
    else:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}; got {scoring!r}.")
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts, balance


def selection_bias(experts: int, gen: torch.Generator) -> torch.Tensor:
    """A fixed sigmoid-routing selection bias, 0.3 x a standard normal draw from ``gen`` (float64; the global RNG
    untouched): the suites' stand-in for the bias DeepSeek-V3's balancing rule moves between steps."""
    return 0.3 * torch.randn(experts, generator=gen, dtype=torch.float64)


def balance_loss(balance: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """E x sum_i f_i P_i over these tokens (see the module's docstring)."""
    counts = torch.bincount(experts.flatten(), minlength=num_experts).to(balance.dtype)
    f = counts / experts.numel()
    return num_experts * (f * balance.mean(0)).sum()


def row_balance(balance: torch.Tensor, experts: torch.Tensor, rows: int, num_experts: int):
    """Per sequence (``rows`` equal runs of the T tokens): (assignments routed to each expert (rows, E), not
    differentiable; the sum over the row's tokens of each expert's probability (rows, E)) — what a sequence's
    load-balancing loss reads, summable over ranks that hold parts of one sequence."""
    onehot = torch.nn.functional.one_hot(experts.reshape(rows, -1), num_experts).to(balance.dtype)
    return onehot.sum(1).detach(), balance.reshape(rows, -1, num_experts).sum(1)


def row_balance_loss(counts: torch.Tensor, psum: torch.Tensor, tokens: int, k: int) -> torch.Tensor:
    """Each sequence's E x sum_i f_i P_i (rows,), from ``row_balance``'s sums over its ``tokens`` tokens:
    f_i = counts_i / (tokens k), P_i = psum_i / tokens (DeepSeek-V3's sequence-wise balance loss)."""
    E = counts.shape[-1]
    return E * (counts / (tokens * k) * psum / tokens).sum(-1)


def routing_gap(moe: MoE, x: torch.Tensor) -> float:
    """The smallest gap between a token's k-th and (k+1)-th selection score (inf when k = E: no choice)."""
    logits = moe.router(x)
    scores = torch.softmax(logits, -1) if moe.scoring == "softmax" else torch.sigmoid(logits) + moe.bias
    if moe.top_k >= scores.shape[-1]:
        return float("inf")
    top = scores.topk(moe.top_k + 1, dim=-1).values
    return float((top[:, moe.top_k - 1] - top[:, moe.top_k]).min())


def zero_missing_grads(params) -> None:
    """Give every parameter without a gradient (an expert no token reached) a zero one, in place: what a
    data-parallel bucket holds for it, so its optimizer state moves on as every stack's does instead of skipping
    the step."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def kept_assignments(experts: torch.Tensor, num_experts: int, capacity_factor: float | None) -> torch.Tensor:
    """(T, k) bool: which assignments an expert takes — all (dropless), or the first ceil(factor T k / E)
    routed to each expert in (token, slot) order."""
    if capacity_factor is None:
        return torch.ones_like(experts, dtype=torch.bool)
    capacity = math.ceil(capacity_factor * experts.numel() / num_experts)
    flat = experts.flatten()
    onehot = torch.nn.functional.one_hot(flat, num_experts)
    rank_in_expert = (onehot.cumsum(0) * onehot).sum(-1) - 1  # 0-based arrival order at its expert
    return (rank_in_expert < capacity).view_as(experts)


def routed_sum(x, weights, experts, modules, kept: torch.Tensor | None = None) -> torch.Tensor:
    """sum over each token's (kept) slots of weight x expert(token), the experts ``modules`` (ids 0 ..)."""
    y = torch.zeros_like(x)
    for e, expert in enumerate(modules):
        chosen = experts == e if kept is None else (experts == e) & kept
        tokens, slots = torch.nonzero(chosen, as_tuple=True)
        if len(tokens):
            y = y.index_add(0, tokens, weights[tokens, slots, None] * expert(x[tokens]))
    return y


class MoE(nn.Module):
    """forward(x (T, hidden)) -> (y (T, hidden), aux): the weighted sum of each token's routed experts (+ the
    shared experts), and the load-balancing loss over these T tokens."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int = 2, shared: int = 0,
                 scoring: str = "softmax", renormalize: bool = True, capacity_factor: float | None = None,
                 dtype=torch.float64):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be between 1 and the number of experts ({experts}); got {top_k}.")
        if scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}; got {scoring!r}.")
        self.num_experts, self.top_k, self.scoring, self.renormalize = experts, top_k, scoring, renormalize
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(hidden, experts, bias=False, dtype=dtype)
        self.experts = nn.ModuleList(SwiGLU(hidden, ffn, dtype) for _ in range(experts))
        self.shared = SwiGLU(hidden, ffn * shared, dtype) if shared else None
        self.register_buffer("bias", torch.zeros(experts, dtype=dtype), persistent=False)

    def route(self, x: torch.Tensor):
        return route(self.router(x), self.top_k, self.scoring, self.renormalize, self.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, experts, balance = self.route(x)
        kept = kept_assignments(experts, self.num_experts, self.capacity_factor)
        y = routed_sum(x, weights, experts, self.experts, kept)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, balance_loss(balance, experts, self.num_experts)
