"""The Llama family's attention over a context-parallel group: this rank's sequence shard in, the same
shard of the one-device attention's output out.

``ContextParallelAttention(dense, group, layout, algorithm)`` holds a replica of ``dense``'s q / k / v / o
projections (``reference.models.GQAttention``): it projects its own tokens, rotates q and k at their
*global* positions (``layout.positions``), attends over the whole sequence by ring attention or Ulysses,
and projects the output. The projections are replicated over the group: each rank's gradient is its
tokens' share, and their sum over the group is one device's (``full_grads``)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ..models.llama import rotate
from .layout import LAYOUTS
from .layout import positions as layout_positions
from .ring import ring_attention
from .ulysses import check_heads, ulysses_attention

ALGORITHMS = ("ring", "ulysses")


class ContextParallelAttention(nn.Module):
    def __init__(self, dense, group, layout: str = "zigzag", algorithm: str = "ring", **planted):
        super().__init__()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}.")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
        self.cp = dist.get_world_size(group)
        if algorithm == "ulysses":
            check_heads(dense.heads, dense.kv_heads, self.cp)
        self.group, self.layout, self.algorithm, self.planted = group, layout, algorithm, planted
        self.heads, self.kv_heads, self.head_dim = dense.heads, dense.kv_heads, dense.head_dim
        self.theta, self.causal = dense.theta, getattr(dense, "causal", True)
        self.q, self.k, self.v, self.o = (copy.deepcopy(m) for m in (dense.q, dense.k, dense.v, dense.o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads_of(t, n):
            return t.view(b, s, n, self.head_dim).transpose(1, 2)

        q = heads_of(self.q(x), self.heads)
        k, v = heads_of(self.k(x), self.kv_heads), heads_of(self.v(x), self.kv_heads)
        out = attend_cp(q, k, v, self.group, self.layout, self.theta, self.causal, self.algorithm, **self.planted)
        return self.o(out)


def every_position(seq: int, cp: int, layout: str, device, second_chunk_shifted: bool = False) -> list[torch.Tensor]:
    """Every rank's global positions (rank order). ``second_chunk_shifted``: planted (the zigzag's second
    chunk taken as chunk r + cp)."""
    out = [layout_positions(seq, cp, i, layout, device) for i in range(cp)]
    if second_chunk_shifted and layout == "zigzag":
        n = seq // (2 * cp)
        out = [torch.cat([p[:n], torch.arange((i + cp) * n, (i + cp + 1) * n, device=device)])
               for i, p in enumerate(out)]
    return out


def attend_cp(q, k, v, group, layout: str, theta: float, causal: bool, algorithm: str, **planted) -> torch.Tensor:
    """The attention core over a CP group: q (b, h, s_local, d), k and v (b, h_kv, s_local, d) of this
    rank's tokens, not yet rotated; rotated at their global positions, attended over the whole sequence by
    ``algorithm``; returns (b, s_local, h d) — ``reference.models.attend_gqa``'s contract, sequence-sharded."""
    cp, r = dist.get_world_size(group), dist.get_rank(group)
    b, h, s, d = q.shape
    every = every_position(s * cp, cp, layout, q.device, bool(planted.get("second_chunk_shifted")))
    mine = every[r] if not planted.get("local_rotary") else torch.arange(s, device=q.device)
    q, k = rotate(q, mine, theta), rotate(k, mine, theta)
    if algorithm == "ring":
        out = ring_attention(q, k, v, every, causal, group, running_max=not planted.get("no_running_max"),
                             local_mask=bool(planted.get("local_mask")))
    else:
        out = ulysses_attention(q, k, v, every, causal, group, reversed_heads=bool(planted.get("reversed_heads")),
                                replicas_summed=not planted.get("replicas_not_summed"))
    return out.transpose(1, 2).reshape(b, s, h * d)


class ContextParallelCore:
    """``attend_gqa``'s replacement inside a (tensor-parallel) attention layer: ``core(q, k, v, positions)``
    attends over ``group`` (the positions given, the shard's own, are not used: the layout's are)."""

    def __init__(self, group, layout: str = "zigzag", algorithm: str = "ring", theta: float = 10000.0,
                 causal: bool = True):
        if layout not in LAYOUTS or algorithm not in ALGORITHMS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} and algorithm one of "
                             f"{', '.join(ALGORITHMS)}; got {layout!r}, {algorithm!r}.")
        self.group, self.layout, self.algorithm, self.theta, self.causal = group, layout, algorithm, theta, causal

    def __call__(self, q, k, v, positions=None) -> torch.Tensor:
        return attend_cp(q, k, v, self.group, self.layout, self.theta, self.causal, self.algorithm)


def full_grads(module: ContextParallelAttention, group) -> dict[str, torch.Tensor]:
    """Every projection's gradient summed over the group (collective), under the dense module's names."""
    out = {}
    for name, p in module.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g, group=group)
        out[name] = g
    return out
