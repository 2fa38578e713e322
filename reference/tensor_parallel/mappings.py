"""The conjugate communication operators of tensor parallelism, as autograd functions.

Each takes its process group explicitly (no global parallel state). Megatron-LM's names and pairs:

| operator                            | forward                       | backward                      |
|-------------------------------------|-------------------------------|-------------------------------|
| copy_to_region                      | identity                      | all-reduce                    |
| reduce_from_region                  | all-reduce                    | identity                      |
| scatter_to_region (last dim)        | keep this rank's slice        | all-gather                    |
| gather_from_region (last dim)       | all-gather                    | keep this rank's slice        |
| gather_from_sequence_region (dim 0) | all-gather                    | reduce-scatter                |
| reduce_scatter_to_sequence_region   | reduce-scatter (dim 0)        | all-gather                    |

A column-parallel layer's input goes through copy_to_region (each rank needs all of it; the input
gradients of the shards add up), a row-parallel layer's output through reduce_from_region (partial
products add up; the gradient is the same everywhere). With sequence parallelism the activations
between them are split along the sequence (dim 0), and the pair becomes all-gather / reduce-scatter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _size(group) -> int:
    return dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous().clone()
    if _size(group) > 1:
        dist.all_reduce(x, group=group)
    return x


def _split_last(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if x.shape[-1] % n:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must divide by the group size ({n}).")
    return x.chunk(n, dim=-1)[dist.get_rank(group)].contiguous()


def _gather_last(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    stacked = _gather_first(x.reshape(1, -1), group)  # (n, numel): rank q's tensor in row q
    return torch.cat([row.view_as(x) for row in stacked.unbind(0)], dim=-1)


def _gather_first(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_first(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    if x.shape[0] % n:
        raise ValueError(f"the sequence dimension ({x.shape[0]}) must divide by the group size ({n}).")
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter(out, x.contiguous(), group=group)
    return out


class _CopyToRegion(torch.autograd.Function):
    """forward: identity; backward: all-reduce."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromRegion(torch.autograd.Function):
    """forward: all-reduce; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToRegion(torch.autograd.Function):
    """forward: keep this rank's slice of the last dim; backward: all-gather the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


class _GatherFromRegion(torch.autograd.Function):
    """forward: all-gather the last dim; backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """forward: all-gather dim 0 (the sequence); backward: reduce-scatter dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first(grad, ctx.group), None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """forward: reduce-scatter dim 0 (the sequence); backward: all-gather dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_first(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first(grad, ctx.group), None


def copy_to_region(x, group=None):
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x, group=None):
    return _ReduceFromRegion.apply(x, group)


def scatter_to_region(x, group=None):
    return _ScatterToRegion.apply(x, group)


def gather_from_region(x, group=None):
    return _GatherFromRegion.apply(x, group)


def gather_from_sequence_region(x, group=None):
    return _GatherFromSequenceRegion.apply(x, group)


def reduce_scatter_to_sequence_region(x, group=None):
    return _ReduceScatterToSequenceRegion.apply(x, group)
