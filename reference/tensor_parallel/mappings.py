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


def _identity(x: torch.Tensor, group) -> torch.Tensor:
    return x.view_as(x)


def _conjugate(name: str, forward, backward) -> type[torch.autograd.Function]:
    """An autograd function: ``forward(x, group)`` forward, ``backward(grad, group)`` backward."""

    def fwd(ctx, x, group):
        ctx.group = group
        return forward(x, group)

    def bwd(ctx, grad):
        return backward(grad, ctx.group), None

    doc = f"forward: {forward.__name__.strip('_')}; backward: {backward.__name__.strip('_')}."
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                                                   "__doc__": doc})


_CopyToRegion = _conjugate("_CopyToRegion", _identity, _all_reduce)
_ReduceFromRegion = _conjugate("_ReduceFromRegion", _all_reduce, _identity)
_ScatterToRegion = _conjugate("_ScatterToRegion", _split_last, _gather_last)
_GatherFromRegion = _conjugate("_GatherFromRegion", _gather_last, _split_last)
_GatherFromSequenceRegion = _conjugate("_GatherFromSequenceRegion", _gather_first, _reduce_scatter_first)
_ReduceScatterToSequenceRegion = _conjugate("_ReduceScatterToSequenceRegion", _reduce_scatter_first, _gather_first)


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
