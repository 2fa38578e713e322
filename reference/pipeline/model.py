"""The model the pipeline suites train: a stack of Linear + ReLU blocks, split into contiguous stages.

Weights and inputs are small integers (as float64): every forward value, loss and first-step gradient is
then an exactly representable integer, so a pipelined first step must equal one device bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn


def build_layers(num_layers: int, hidden: int, seed: int, dtype=torch.float64) -> list[nn.Module]:
    """``num_layers`` blocks Linear(hidden, hidden) + ReLU with weights and biases in {-1, 0, 1}."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(num_layers):
        lin = nn.Linear(hidden, hidden, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randint(-1, 2, lin.weight.shape, generator=gen, dtype=torch.int64))
            lin.bias.copy_(torch.randint(-1, 2, lin.bias.shape, generator=gen, dtype=torch.int64))
        layers.append(nn.Sequential(lin, nn.ReLU()))
    return layers


def split_stages(layers: list[nn.Module], num_stages: int) -> list[nn.Sequential]:
    """Contiguous stages whose layer counts differ by at most one (earlier stages get the extra)."""
    if not 1 <= num_stages <= len(layers):
        raise ValueError(f"num_stages must be between 1 and the number of layers ({len(layers)}); got {num_stages}.")
    base, extra = divmod(len(layers), num_stages)
    stages, lo = [], 0
    for s in range(num_stages):
        hi = lo + base + (1 if s < extra else 0)
        stages.append(nn.Sequential(*layers[lo:hi]))
        lo = hi
    return stages


def batch(size: int, hidden: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), integers in [-2, 2]: one global batch, sliced identically on every rank."""
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(-2, 3, (size, hidden), generator=gen).to(dtype)
    y = torch.randint(-2, 3, (size, hidden), generator=gen).to(dtype)
    return x, y


def sum_squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum-reduced loss: microbatch losses add up to the whole batch's, with no 1/m anywhere."""
    return ((out - target) ** 2).sum()


def masked_sum_squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``sum_squared_error`` over the rows whose target counts: a row of NaN (padding) adds nothing — a
    microbatch of padding only has loss 0 and zero gradients, never NaN."""
    keep = ~torch.isnan(target).any(dim=-1)
    return ((out[keep] - target[keep]) ** 2).sum()


def pad_rows(target: torch.Tensor, rows: int) -> torch.Tensor:
    """``target`` with its last ``rows`` rows padding (NaN)."""
    target = target.clone()
    if rows:
        target[-rows:] = float("nan")
    return target
