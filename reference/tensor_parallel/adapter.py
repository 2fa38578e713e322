"""The tensor-parallel contract on the reference layers."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..errors import Unsupported
from .layers import ColumnParallelLinear, DenseAttention, ParallelAttention, ParallelMLP, RowParallelLinear
from .mappings import _gather_first, _gather_last
from .vocab import ParallelLMHead, VocabParallelEmbedding


class ReferenceTensorParallel:
    """Every kind of harness/contracts/tensor_parallel.py."""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        if kind == "column":
            return ColumnParallelLinear.from_dense(dense, group, sequence_parallel=sequence_parallel)
        if kind == "row":
            return RowParallelLinear.from_dense(dense, group, sequence_parallel=sequence_parallel)
        if kind == "mlp":
            fc1, act, fc2 = dense
            if not isinstance(act, nn.GELU):
                raise Unsupported(f"the reference MLP applies GELU between its linears, not {type(act).__name__}.")
            return ParallelMLP.from_dense(fc1, fc2, group, sequence_parallel=sequence_parallel)
        if kind == "embedding":
            return VocabParallelEmbedding.from_dense(dense, group, sequence_parallel=sequence_parallel)
        if kind == "lm_head":
            return ParallelLMHead.from_dense(dense, group, sequence_parallel=sequence_parallel)
        if kind == "attention":
            if not isinstance(dense, DenseAttention):
                raise Unsupported(f"the reference shards DenseAttention, not {type(dense).__name__}.")
            return ParallelAttention.from_dense(dense, group, sequence_parallel=sequence_parallel)
        raise Unsupported(f"kind {kind!r} is not one of column, row, mlp, embedding, lm_head, attention.")

    def full_grads(self, kind, sharded, group=None) -> dict:
        if kind == "mlp":
            return _prefixed({"0": ("column", sharded.fc1), "2": ("row", sharded.fc2)}, self, group)
        if kind == "attention":
            return _prefixed({"q": ("column", sharded.q), "k": ("column", sharded.k), "v": ("column", sharded.v),
                              "o": ("row", sharded.o)}, self, group)
        if kind in ("embedding", "lm_head"):
            # ceil(V / n) rows per rank, the padding rows (never looked up, masked out of the loss) dropped
            return {"weight": _gather_first(sharded.weight.grad, group)[: sharded.vocab_size]}
        return full_linear_grads(kind, sharded.weight, sharded.bias, group,
                                 partial_bias=kind == "row" and sharded.sequence_parallel)


def _prefixed(parts: dict, impl, group) -> dict:
    """Full gradients of a composite layer from its sub-layers' ({prefix: (kind, module)})."""
    return {f"{prefix}.{k}": v for prefix, (kind, module) in parts.items()
            for k, v in impl.full_grads(kind, module, group).items()}


def full_linear_grads(kind: str, weight, bias, group=None, partial_bias: bool = False) -> dict:
    """The dense layer's full gradients from a column- or row-parallel shard's (Megatron's even split):
    column shards stack along the output features, row shards along the input features; a row
    layer's bias is replicated, its gradient partial under sequence parallelism (then summed)."""
    if kind == "column":
        grads = {"weight": _gather_first(weight.grad, group)}
        if bias is not None:
            grads["bias"] = _gather_first(bias.grad, group)
        return grads
    grads = {"weight": _gather_last(weight.grad, group)}
    if bias is not None:
        b = bias.grad.clone()
        if partial_bias and dist.get_world_size(group) > 1:
            dist.all_reduce(b, group=group)  # each rank saw its sequence slice only
        grads["bias"] = b
    return grads
