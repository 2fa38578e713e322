"""Tensor parallelism: conjugate communication operators and sharded layers, each taking its group."""

from .layers import (
                     ColumnParallelLinear,
                     DenseAttention,
                     ParallelAttention,
                     ParallelMLP,
                     RowParallelLinear,
)
from .mappings import (
                     copy_to_region,
                     gather_from_region,
                     gather_from_sequence_region,
                     reduce_from_region,
                     reduce_scatter_to_sequence_region,
                     scatter_to_region,
)
from .sharded import tp_sharded_parameters
from .vocab import ParallelLMHead, VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["ColumnParallelLinear", "DenseAttention", "ParallelAttention", "ParallelLMHead", "ParallelMLP",
           "RowParallelLinear", "VocabParallelEmbedding", "copy_to_region", "gather_from_region",
           "gather_from_sequence_region", "reduce_from_region", "reduce_scatter_to_sequence_region",
           "scatter_to_region", "tp_sharded_parameters", "vocab_parallel_cross_entropy"]
