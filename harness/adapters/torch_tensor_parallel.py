"""The ``torch`` tensor-parallel implementation: DTensor ``parallelize_module`` on a device mesh of the
group, with ColwiseParallel / RowwiseParallel (sequence parallelism through their input / output
layouts Shard(0)). Full gradients are the DTensor gradients' ``full_tensor()``."""

from __future__ import annotations

import copy

import torch.distributed as dist

from ..contracts import Unsupported
from ..world import rank_device


class TorchTensorParallel:
    def known_nonconformance(self, kind, dense, group=None) -> str | None:
        """Cases this suite found DTensor not to match the dense layer (suites/tensor_parallel/
        test_findings.py): reported as such, never as a pass."""
        n = dist.get_world_size(group)
        row = {"row": dense, "mlp": dense[-1] if kind == "mlp" else None}.get(kind)
        if row is not None and row.bias is not None and n & (n - 1):
            return (f"DTensor RowwiseParallel adds bias / {n} on each of {n} ranks to a Partial output: it rounds "
                    "when the mesh size is not a power of two (minimal case: tp=3, Linear(3, 4)).")
        return None

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = DeviceMesh.from_group(group or dist.group.WORLD, rank_device().type)
        seq = Shard(0) if sequence_parallel else Replicate()
        module = copy.deepcopy(dense)
        column = {"column": module, "mlp": module[0] if kind == "mlp" else None}.get(kind)
        row = {"row": module, "mlp": module[-1] if kind == "mlp" else None}.get(kind)
        # Found by this suite (torch 2.13): on a 1-rank mesh, a sharded dimension of size 1 breaks DTensor's
        # sharding propagation ("This operation would remove or reshape sharded dimension ...", aten.view),
        # e.g. ColwiseParallel of Linear(k, 1) with bias, RowwiseParallel of Linear(1, 2) on a (1, 1, 1)
        # input. suites/tensor_parallel/test_findings.py keeps it under watch.
        if mesh.size() == 1 and ((column is not None and column.out_features == 1)
                                 or (row is not None and row.in_features == 1)):
            raise Unsupported("DTensor fails on a size-1 sharded dimension of a 1-rank mesh (torch 2.13).")
        if row is not None and row.in_features % mesh.size():
            # Found by this suite: with uneven input shards RowwiseParallel fails inside the matmul
            # ("a and b must have same reduction dim") — from_local assumes even shards. Say it clearly.
            raise ValueError(f"in_features ({row.in_features}) must divide by the tensor-parallel size "
                             f"({mesh.size()}) for DTensor RowwiseParallel.")
        if kind == "column":
            return parallelize_module(module, mesh, ColwiseParallel(input_layouts=seq))
        if kind == "row":
            return parallelize_module(module, mesh, RowwiseParallel(output_layouts=seq))
        if kind == "mlp":
            return parallelize_module(module, mesh, {"0": ColwiseParallel(input_layouts=seq),
                                                     "2": RowwiseParallel(output_layouts=seq)})
        raise Unsupported(f"kind {kind!r} is not one of column, row, mlp.")

    def full_grads(self, kind, sharded, group=None) -> dict:
        return {name: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                for name, p in sharded.named_parameters()}
