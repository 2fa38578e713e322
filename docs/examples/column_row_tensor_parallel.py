"""A tensor-parallel implementation to copy from: Megatron's column- and row-parallel Linear, each with
its conjugate pair of autograd functions, and nothing else. Run it through the suite with

    pytest suites/tensor_parallel --impl docs.examples.column_row_tensor_parallel:ColumnRowOnly

The other kinds and sequence parallelism are ``Unsupported``; a feature size that does not divide by
the group size is refused in one sentence (ValueError).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from harness.contracts import Unsupported


class _Copy(torch.autograd.Function):
    """forward: identity; backward: all-reduce (each rank's input gradient is a partial sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    """forward: all-reduce (each rank holds a partial output); backward: identity."""

    @staticmethod
    def forward(ctx, y, group):
        y = y.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Sharded(nn.Module):
    def __init__(self, kind, weight, bias, group):
        super().__init__()
        self.kind, self.group = kind, group
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def forward(self, x):
        if self.kind == "column":  # y_r = x W_r^T + b_r
            return nn.functional.linear(_Copy.apply(x, self.group), self.weight, self.bias)
        y = _Reduce.apply(nn.functional.linear(x, self.weight), self.group)  # y = sum_r x_r W_r^T
        return y if self.bias is None else y + self.bias


class ColumnRowOnly:
    """The tensor-parallel contract (harness/contracts/tensor_parallel.py), kinds "column" and "row"."""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        if kind not in ("column", "row") or sequence_parallel:
            raise Unsupported(f"this example shards column and row Linears without sequence parallelism; "
                              f"got kind {kind!r}, sequence_parallel={sequence_parallel}.")
        n, r = dist.get_world_size(group), dist.get_rank(group)
        dim = 0 if kind == "column" else 1  # split output features (column) or input features (row)
        size = dense.weight.shape[dim]
        if size % n:
            raise ValueError(f"{kind}: {size} features do not divide by {n} ranks.")
        weight = dense.weight.chunk(n, dim)[r]
        bias = dense.bias.chunk(n)[r] if (dense.bias is not None and kind == "column") else dense.bias
        return _Sharded(kind, weight, bias, group)

    def full_grads(self, kind, sharded, group=None) -> dict:
        n = dist.get_world_size(group)
        out = {"weight": _gather(sharded.weight.grad, 0 if kind == "column" else 1, n, group)}
        if sharded.bias is not None:  # row's bias is replicated: its gradient is already full everywhere
            out["bias"] = _gather(sharded.bias.grad, 0, n, group) if kind == "column" else sharded.bias.grad.clone()
        return out


def _gather(t, dim, n, group):
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)
