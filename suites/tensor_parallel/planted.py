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


# --- the layers' own arithmetic wrong (each the reference's layer with one step changed) ---------------------------


def _replaced(sharded, cls: type, forward) -> object:
    """``sharded`` with the forward of each of its ``cls`` modules (itself, an MLP's fc2, attention's o) replaced."""
    import types

    for module in sharded.modules():
        if type(module) is cls:
            module.forward = types.MethodType(forward, module)
    return sharded


class _Planted(ReferenceTensorParallel):
    """The reference with ``bug`` (a forward of ``layer``, the reference's class by name) in every such module."""

    layer = ""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        from reference import tensor_parallel as tp

        return _replaced(super().shard(kind, dense, group, sequence_parallel), getattr(tp, self.layer), type(self).bug)


class RowBiasOnEveryRank(_Planted):
    """Planted bug: the row-parallel layer adds its bias to each rank's partial product, before the reduction —
    the output carries the bias tp times (row, the MLP's fc2, attention's output projection)."""

    layer = "RowParallelLinear"

    def bug(self, x):
        from reference.tensor_parallel.layers import project
        from reference.tensor_parallel.mappings import (
            reduce_from_region,
            reduce_scatter_to_sequence_region,
            scatter_to_region,
        )

        y = project(self, x if self.input_is_parallel else scatter_to_region(x, self.group), bias=self.bias)
        return (reduce_scatter_to_sequence_region if self.sequence_parallel else reduce_from_region)(y, self.group)


class ColumnInputGradNotReduced(_Planted):
    """Planted bug: without sequence parallelism the column-parallel layer takes its input as it is, not through
    copy_to_region — its backward never all-reduces the input gradient, each rank's is its shard's part only."""

    layer = "ColumnParallelLinear"

    def bug(self, x):
        from reference.tensor_parallel.layers import project
        from reference.tensor_parallel.mappings import gather_from_region, gather_from_sequence_region

        x = gather_from_sequence_region(x, self.group) if self.sequence_parallel else x
        y = project(self, x, bias=self.bias)
        return gather_from_region(y, self.group) if self.gather_output else y


class EmbeddingNotMasked(_Planted):
    """Planted bug: the vocabulary-parallel embedding looks every token up on every rank — a token another rank
    holds reads this rank's row 0 instead of contributing zeros."""

    layer = "VocabParallelEmbedding"

    def bug(self, tokens):
        import torch
        import torch.nn.functional as F

        from reference.tensor_parallel.mappings import reduce_from_region, reduce_scatter_to_sequence_region

        mine = (tokens >= self.start) & (tokens < self.end)
        out = F.embedding(torch.where(mine, tokens - self.start, torch.zeros_like(tokens)), self.weight)
        return (reduce_scatter_to_sequence_region if self.sequence_parallel else reduce_from_region)(out, self.group)


class VocabRemainderDropped(ReferenceTensorParallel):
    """Planted bug: the vocabulary split floor(V / tp) rows per rank — the last V % tp rows on no rank (their
    tokens embed to zeros, their logits leave the softmax; V % tp == 0 is right)."""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        import torch
        import torch.distributed as dist

        sharded = super().shard(kind, dense, group, sequence_parallel)
        if kind in ("embedding", "lm_head"):
            per_rank = sharded.vocab_size // dist.get_world_size(group)
            sharded.start = dist.get_rank(group) * per_rank
            sharded.end = sharded.start + per_rank
            with torch.no_grad():
                sharded.weight.zero_()
                sharded.weight[:per_rank].copy_(dense.weight[sharded.start:sharded.end])
        return sharded


class CrossEntropyLocalMax(ReferenceTensorParallel):
    """Planted bug: the vocabulary-parallel cross-entropy shifts each rank's logits by that rank's own maximum (the
    MAX all-reduce left out) and then sums their exponentials across ranks: the loss and its gradient mix shifts."""

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        sharded = super().shard(kind, dense, group, sequence_parallel)
        if kind == "lm_head":
            forward = sharded.forward

            def local_max(x, target):
                from reference.tensor_parallel import vocab

                real, vocab.dist = vocab.dist, _NoMaxReduce(vocab.dist)
                try:
                    return forward(x, target)
                finally:
                    vocab.dist = real

            sharded.forward = local_max
        return sharded


class _NoMaxReduce:
    """torch.distributed, but an all-reduce of MAX does nothing (the planted CrossEntropyLocalMax's only change)."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_reduce(self, tensor, op=None, group=None):
        if op == self._dist.ReduceOp.MAX:
            return None
        return self._dist.all_reduce(tensor, group=group, **({} if op is None else {"op": op}))


class SequenceParallelBiasPartial(ReferenceTensorParallel):
    """Planted bug: under sequence parallelism the row-parallel bias's gradient — each rank's sequence block's
    only — is reported without its sum over the group (Megatron all-reduces such replicated parameters)."""

    def full_grads(self, kind, sharded, group=None) -> dict:
        from reference.tensor_parallel.adapter import full_linear_grads

        if kind in ("column", "row"):
            return full_linear_grads(kind, sharded.weight, sharded.bias, group)  # partial_bias left False
        return super().full_grads(kind, sharded, group)
