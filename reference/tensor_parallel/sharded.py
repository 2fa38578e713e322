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


def tp_split_matrices(module: nn.Module) -> dict:
    """{id(weight): (dim, group, replicas)} of the linear weights of ``module`` split over a TP group of more than
    one rank: a column-parallel weight's rows (dim 0), a row-parallel weight's columns (dim 1), group rank r holding
    block r // replicas — replicas 1, or a grouped-query attention's K and V with fewer KV heads than ranks
    (``reference.models.sharding.ParallelGQAttention``: tp / kv consecutive ranks hold one KV head's rows). What a
    matrix optimizer gathers to see the whole (``reference.muon.optimizer``)."""
    import torch.distributed as dist

    from reference.models.sharding import ParallelGQAttention

    found = {}
    for mod in module.modules():
        if isinstance(mod, ColumnParallelLinear | RowParallelLinear) and dist.get_world_size(mod.group) > 1:
            found[id(mod.weight)] = (0 if isinstance(mod, ColumnParallelLinear) else 1, mod.group, 1)
        elif isinstance(mod, ParallelGQAttention) and mod.slot is not None:
            found.update({id(lin.weight): (0, mod.group, mod.replicas) for lin in (mod.k, mod.v)})
    return found
