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
