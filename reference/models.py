"""Small models the suites train, defined once: batch-first (batch, ..., features) activations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: tuple[int, ...] = (4, 5, 3), dtype=torch.float64) -> nn.Sequential:
    """Linear-GELU-...-Linear. The default has 43 parameters (4*5 + 5 + 5*3 + 3): a prime, so no data-
    parallel size > 1 divides it and every ZeRO shard boundary needs padding."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers += [nn.Linear(a, b, dtype=dtype)] + ([nn.GELU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(LN(x)), then + MLP(LN(.)) with GELU; (batch, seq, hidden)."""

    def __init__(self, hidden: int = 8, heads: int = 2, ffn: int = 16, dtype=torch.float64):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}).")
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden, dtype=dtype), nn.LayerNorm(hidden, dtype=dtype)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden, dtype=dtype), nn.Linear(hidden, hidden, dtype=dtype)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn, dtype=dtype), nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(h // self.heads), dim=-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
