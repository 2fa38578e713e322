"""The masked (padded) data-parallel recipe: a target row of NaN (``IGNORED``) counts nothing, and the loss is
the mean squared error over the **global** batch's counted rows — the data-parallel analogue of a language
model's loss over its counted tokens. A rank, or a micro-step, may hold no counted row at all.

Each rank knows only its slice, so it all-reduces its count over the group (as torchtitan all-reduces its
valid tokens); the group then averages its ranks' gradients, so each rank divides its micro-steps' summed
squared errors by its ``share`` of the global count: counted elements / group size. The per-micro-step mean
(averaged over micro-steps) and the per-rank mean (averaged over ranks) are the two classic ways to get it
wrong: both weigh rows by how their micro-step or rank happens to be padded, and a micro-step with no counted
row makes their mean 0 / 0."""

from __future__ import annotations

import torch
import torch.distributed as dist

IGNORED = float("nan")
"""The target value of a row that counts nothing."""


def counted_rows(y: torch.Tensor) -> torch.Tensor:
    """(rows,) bool: the rows of ``y`` whose target counts (no NaN in it)."""
    return ~torch.isnan(y.reshape(len(y), -1)).any(dim=1)


def counted_elements(y: torch.Tensor) -> int:
    """The target elements the loss averages over: the counted rows' elements."""
    return int(counted_rows(y).sum()) * (y[0].numel() if len(y) else 0)


def summed_squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The squared error summed over the counted rows (none counted: 0, never NaN)."""
    keep = counted_rows(y)
    return (out[keep] - y[keep]).pow(2).sum()


def mean_squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One device's loss on the whole batch: the mean over the counted rows' elements."""
    return summed_squared_error(out, y) / counted_elements(y)


def share(y: torch.Tensor, group=None) -> float:
    """This rank's divisor for its slice ``y``: the global batch's counted elements (its count all-reduced over
    ``group``, a collective) / the group's size."""
    count = torch.tensor([float(counted_elements(y))], dtype=torch.float64, device=y.device)
    n = dist.get_world_size(group) if dist.is_initialized() else 1
    if n > 1:
        dist.all_reduce(count, group=group)
    return float(count) / n
