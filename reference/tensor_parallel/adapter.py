"""The tensor-parallel contract on the reference layers."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..errors import Unsupported
from .layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear
from .mappings import _gather_first, _gather_last


class ReferenceTensorParallel:
    """kinds "column", "row", "mlp" (see harness/contracts/tensor_parallel.py)."""

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
        raise Unsupported(f"kind {kind!r} is not one of column, row, mlp.")

    def full_grads(self, kind, sharded, group=None) -> dict:
        if kind == "mlp":
            return {f"0.{k}": v for k, v in self.full_grads("column", sharded.fc1, group).items()} | \
                {f"2.{k}": v for k, v in self.full_grads("row", sharded.fc2, group).items()}
        w = sharded.weight.grad
        if kind == "column":
            grads = {"weight": _gather_first(w, group)}
            if sharded.bias is not None:
                grads["bias"] = _gather_first(sharded.bias.grad, group)
            return grads
        grads = {"weight": _gather_last(w, group)}
        if sharded.bias is not None:
            b = sharded.bias.grad.clone()
            if sharded.sequence_parallel and dist.get_world_size(group) > 1:
                dist.all_reduce(b, group=group)  # each rank saw its sequence slice only
            grads["bias"] = b
        return grads

