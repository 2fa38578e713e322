"""Planted bugs behind the tensor-parallel contract, loaded by spec like a user's implementation."""

from __future__ import annotations

from reference.tensor_parallel.adapter import ReferenceTensorParallel


class ReturnsLocalShardGrads(ReferenceTensorParallel):
    """Planted bug: full_grads hands back this rank's shard of each gradient instead of the gathered one."""

    def full_grads(self, kind, sharded, group=None) -> dict:
        full = super().full_grads(kind, sharded, group)
        local = {name.rsplit(".", 1)[-1]: p.grad for name, p in sharded.named_parameters() if p.grad is not None}
        return {name: local.get(name.rsplit(".", 1)[-1], g) for name, g in full.items()}


class RaisesInFullGrads(ReferenceTensorParallel):
    """Planted bug: full_grads raises (on every rank, before any collective)."""

    def full_grads(self, kind, sharded, group=None) -> dict:
        raise RuntimeError("gradients not gathered yet")


class LastRankRaisesInForward(ReferenceTensorParallel):
    """Planted: the sharded module's forward raises on the last rank only; the others enter the layer's
    all-reduce (row) or its backward's (column) and block there."""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        import torch.distributed as dist

        sharded = super().shard(kind, dense, group, sequence_parallel)
        if dist.get_rank(group) == dist.get_world_size(group) - 1:
            def forward(*args, **kw):
                raise ValueError("features not divisible on the last rank")

            sharded.forward = forward
        return sharded
