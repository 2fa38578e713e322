"""Tensor-parallel layers (Shoeybi et al. 2019, "Megatron-LM"; Korthikanti et al. 2022 for sequence
parallelism), each buildable from the dense layer's weights with ``from_dense(layer, group)``: build the
full weight, then split it, so a sharded layer can be held to the dense one exactly.

Shapes: activations are (seq, batch, hidden) or any (..., features); with ``sequence_parallel`` the
activations outside a column/row pair are split along dim 0 (the sequence) across the group.
Communication per layer per microbatch: a column + row pair moves one all-reduce of the (s, b, h)
activations forward and one backward (or an all-gather + reduce-scatter with sequence parallelism).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .mappings import (
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
    scatter_to_region,
)


def _split(total: int, group, what: str) -> tuple[int, int]:
    """(this rank's share, its offset) of ``total``, which must divide by the group size."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if total % n:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        raise ValueError(f"{what} ({total}) must divide by the tensor-parallel size ({n}); "
                         f"sizes that divide it: {', '.join(map(str, divisors))}.")
    share = total // n
    return share, r * share


def project(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor | None = None,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``layer``'s weight by default — or ``layer.recipe_linear(x, weight, bias)``
    where a low-precision recipe was set on it (``reference.low_precision.convert.set_recipe``)."""
    w = layer.weight if weight is None else weight
    scaled = getattr(layer, "recipe_linear", None)
    return F.linear(x, w, bias) if scaled is None else scaled(x, w, bias)


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split by rows (output features): rank r computes Y[..., r-th block].

    forward: copy_to_region (or gather_from_sequence_region) -> local linear -> optionally
    gather_from_region (gather_output=True).
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False, dtype=None):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.out_per_rank, self.offset = _split(out_features, group, "out_features")
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(self.out_per_rank, dtype=dtype)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @classmethod
    def from_dense(cls, layer: nn.Linear, group=None, **kwargs) -> ColumnParallelLinear:
        self = cls(layer.in_features, layer.out_features, group, layer.bias is not None, dtype=layer.weight.dtype,
                   **kwargs)
        rows = slice(self.offset, self.offset + self.out_per_rank)
        with torch.no_grad():
            self.weight.copy_(layer.weight[rows])
            if self.bias is not None:
                self.bias.copy_(layer.bias[rows])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = gather_from_sequence_region(x, self.group) if self.sequence_parallel else copy_to_region(x, self.group)
        y = project(self, x, bias=self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A split by columns (input features): rank r holds X[..., r-th block] and adds
    its partial product; the bias is added once, after the reduction.

    forward: optionally scatter_to_region (input_is_parallel=False) -> local linear ->
    reduce_from_region (or reduce_scatter_to_sequence_region) -> + bias.

    With sequence_parallel the bias is added to this rank's sequence slice only, so its gradient is
    partial: sum it over the group before the optimizer step (as Megatron all-reduces the gradients
    of parameters replicated across a sequence-parallel region).
    """

    def __init__(self, in_features: int, out_features: int, group=None, bias: bool = True,
                 input_is_parallel: bool = True, sequence_parallel: bool = False, dtype=None):
        super().__init__()
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.in_per_rank, self.offset = _split(in_features, group, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @classmethod
    def from_dense(cls, layer: nn.Linear, group=None, **kwargs) -> RowParallelLinear:
        self = cls(layer.in_features, layer.out_features, group, layer.bias is not None, dtype=layer.weight.dtype,
                   **kwargs)
        with torch.no_grad():
            self.weight.copy_(layer.weight[:, self.offset:self.offset + self.in_per_rank])
            if self.bias is not None:
                self.bias.copy_(layer.bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_region(x, self.group)
        y = project(self, x)
        y = reduce_scatter_to_sequence_region(y, self.group) if self.sequence_parallel \
            else reduce_from_region(y, self.group)
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """Column-parallel fc1 -> GeLU -> row-parallel fc2: one all-reduce forward, one backward."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_dense(cls, fc1: nn.Linear, fc2: nn.Linear, group=None, sequence_parallel: bool = False) -> ParallelMLP:
        return cls(ColumnParallelLinear.from_dense(fc1, group, sequence_parallel=sequence_parallel),
                   RowParallelLinear.from_dense(fc2, group, sequence_parallel=sequence_parallel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class DenseAttention(nn.Module):
    """Plain multi-head self-attention on (seq, batch, hidden): the layer ParallelAttention splits."""

    def __init__(self, hidden: int, heads: int, dtype=None, causal: bool = False):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}).")
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, dtype=dtype) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(_attend(self.q(x), self.k(x), self.v(x), self.heads, self.causal))


def _attend(q, k, v, heads: int, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per head (position i attends to j <= i when causal); (seq, batch,
    heads * d) in and out."""
    s, b, width = q.shape
    d = width // heads

    def split(t):
        return t.reshape(s, b, heads, d).permute(1, 2, 0, 3)  # (batch, heads, seq, d)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ split(v)).permute(2, 0, 1, 3).reshape(s, b, width)


class ParallelAttention(nn.Module):
    """Heads split across ranks: q, k, v column-parallel (this rank's heads), the attention core local,
    o row-parallel. One all-reduce forward and one backward (all-gather + reduce-scatter with sequence
    parallelism). The heads must divide by the group size."""

    def __init__(self, q, k, v, o: RowParallelLinear, local_heads: int, group=None, sequence_parallel=False,
                 causal: bool = False):
        super().__init__()
        self.q, self.k, self.v, self.o = q, k, v, o
        self.local_heads, self.group, self.causal = local_heads, group, causal
        self.sequence_parallel = sequence_parallel

    @classmethod
    def from_dense(cls, dense: DenseAttention, group=None, sequence_parallel: bool = False) -> ParallelAttention:
        local_heads, _ = _split(dense.heads, group, "heads")
        q, k, v = (ColumnParallelLinear.from_dense(lin, group) for lin in (dense.q, dense.k, dense.v))
        o = RowParallelLinear.from_dense(dense.o, group, sequence_parallel=sequence_parallel)
        return cls(q, k, v, o, local_heads, group, sequence_parallel, getattr(dense, "causal", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One input mapping for the three projections (their input gradients add before the reduction).
        x = gather_from_sequence_region(x, self.group) if self.sequence_parallel else copy_to_region(x, self.group)
        q, k, v = (project(lin, x, bias=lin.bias) for lin in (self.q, self.k, self.v))
        return self.o(_attend(q, k, v, self.local_heads, self.causal))
