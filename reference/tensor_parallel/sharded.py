"""Which parameters tensor parallelism splits (each TP rank holds a different part) and which it replicates."""

from __future__ import annotations

from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear
from .vocab import ParallelLMHead, VocabParallelEmbedding


def tp_sharded_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module`` split over their TP group: column-parallel weights and biases,
    row-parallel weights, the vocabulary-parallel embedding's and head's rows. Every other parameter —
    LayerNorms, a row-parallel layer's bias (added once, after the reduction) — is replicated: the same
    tensor, with the same gradient, on every rank of the group."""
    found = []
    for mod in module.modules():
        if isinstance(mod, ColumnParallelLinear):
            found += [p for p in (mod.weight, mod.bias) if p is not None]
        elif isinstance(mod, RowParallelLinear | VocabParallelEmbedding | ParallelLMHead):
            found.append(mod.weight)
    return found

