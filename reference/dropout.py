"""Dropout whose masks do not depend on the layout: every mask is a function of
(seed, step, layer, site, global sample index) only.

The RNG policy of the reference 3D stack, per (dp, pp, tp) coordinate: there is no per-rank generator
state. A DP replica draws the masks of the global samples it holds (its rows of the global batch), a
pipeline stage those of the layers it holds (the global layer index), and the tensor-parallel ranks of a
group the same mask (every dropout site sits where the activation is replicated over the TP group: after
the embedding's all-reduce, after the attention's and the MLP's row-parallel all-reduce). Recomputation
(activation checkpointing) draws the same mask again. So a run resumed on another layout draws the masks
an uninterrupted one-device run draws, from ``(seed, step)`` alone — the whole RNG state a checkpoint
needs. (Attention-probability dropout, over TP-sharded heads, would add the global head index to the key;
the reference GPT has none.) Megatron instead seeds one generator per TP rank and offsets it by the PP
rank, which changes every mask when the layout changes.

``DropoutKey`` is the mutable part, shared by every ``KeyedDropout`` of a model: the trainer sets ``step``
before each step and ``samples`` (the global indices of the rows the next forward sees) before each
microbatch; ``samples`` None means rows 0..n-1 (one device, the whole batch).
"""

from __future__ import annotations

import torch
from torch import nn

SITES = ("embed", "attn", "mlp")


class DropoutKey:
    def __init__(self, seed: int = 0):
        self.seed, self.step, self.samples = seed, 0, None

    def rows(self, n: int) -> list[int]:
        samples = range(n) if self.samples is None else [int(s) for s in self.samples]
        if len(samples) != n:
            raise ValueError(f"the dropout key names {len(samples)} samples but the activation has {n} rows.")
        return list(samples)


def _seed(*parts: int) -> int:
    """One 63-bit generator seed from the key's integers (a polynomial hash, distinct for distinct keys
    in practice: the parts are small)."""
    h = 0
    for part in parts:
        h = (h * 1_000_003 + part + 1) % (1 << 63)
    return h


class KeyedDropout(nn.Module):
    """Zeroes each element with probability ``p`` and scales the rest by 1 / (1 - p), in training mode;
    the mask of row r is drawn from a generator seeded by (seed, step, layer, site, global sample of r)."""

    def __init__(self, p: float, key: DropoutKey, layer: int, site: str):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1); got {p}.")
        if site not in SITES:
            raise ValueError(f"dropout site must be one of {', '.join(SITES)}; got {site!r}.")
        self.p, self.key, self.layer, self.site = p, key, layer, SITES.index(site)

    def mask(self, shape: torch.Size) -> torch.Tensor:
        """The 0 / 1 mask of an activation of ``shape`` (rows first) under the current key."""
        k = self.key
        rows = []
        for sample in k.rows(shape[0]):
            gen = torch.Generator().manual_seed(_seed(k.seed, k.step, self.layer + 1, self.site, sample))
            rows.append(torch.rand(shape[1:], generator=gen, dtype=torch.float64) >= self.p)
        return torch.stack(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return x * self.mask(x.shape).to(device=x.device, dtype=x.dtype) * (1.0 / (1.0 - self.p))
