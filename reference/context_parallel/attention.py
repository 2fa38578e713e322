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
from . import layout as layouts
from .ring import ring_attention
from .ulysses import check_heads, ulysses_attention

ALGORITHMS = ("ring", "ulysses")


class ContextParallelAttention(nn.Module):
    def __init__(self, dense, group, layout: str = "zigzag", algorithm: str = "ring", **planted):
        super().__init__()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}.")
        if layout not in layouts.LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(layouts.LAYOUTS)}; got {layout!r}.")
        self.cp = dist.get_world_size(group)
        if algorithm == "ulysses":
            check_heads(dense.heads, dense.kv_heads, self.cp)
        self.group, self.layout, self.algorithm, self.planted = group, layout, algorithm, planted
        self.heads, self.kv_heads, self.head_dim = dense.heads, dense.kv_heads, dense.head_dim
        self.theta, self.causal = dense.theta, getattr(dense, "causal", True)
        self.q, self.k, self.v, self.o = (copy.deepcopy(m) for m in (dense.q, dense.k, dense.v, dense.o))

    def positions(self, seq: int, device) -> list[torch.Tensor]:
        """Every rank's global positions (rank order)."""
        out = [layouts.positions(seq, self.cp, i, self.layout, device) for i in range(self.cp)]
        if self.planted.get("second_chunk_shifted") and self.layout == "zigzag":  # planted: chunk r + cp
            n = seq // (2 * self.cp)
            out = [torch.cat([p[:n], torch.arange((i + self.cp) * n, (i + self.cp + 1) * n, device=device)])
                   for i, p in enumerate(out)]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        r = dist.get_rank(self.group)
        every = self.positions(s * self.cp, x.device)
        mine = every[r] if not self.planted.get("local_rotary") else torch.arange(s, device=x.device)

        def heads_of(t, n):
            return t.view(b, s, n, self.head_dim).transpose(1, 2)

        q = heads_of(self.q(x), self.heads)
        k, v = heads_of(self.k(x), self.kv_heads), heads_of(self.v(x), self.kv_heads)
        q, k = rotate(q, mine, self.theta), rotate(k, mine, self.theta)
        if self.algorithm == "ring":
            out = ring_attention(q, k, v, every, self.causal, self.group,
                                 running_max=not self.planted.get("no_running_max"),
                                 local_mask=bool(self.planted.get("local_mask")))
        else:
            out = ulysses_attention(q, k, v, every, self.causal, self.group,
                                    reversed_heads=bool(self.planted.get("reversed_heads")),
                                    replicas_summed=not self.planted.get("replicas_not_summed"))
        return self.o(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def full_grads(module: ContextParallelAttention, group) -> dict[str, torch.Tensor]:
    """Every projection's gradient summed over the group (collective), under the dense module's names."""
    out = {}
    for name, p in module.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g, group=group)
        out[name] = g
    return out
