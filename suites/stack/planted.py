"""Planted bugs behind the stack contract, loaded by spec like a user's stack."""

from __future__ import annotations

from harness.adapters.reference_stack import ReferenceStack, ReferenceStackTrainer


class _KVNotSummed(ReferenceStackTrainer):
    def _build(self, model):
        from reference.models.sharding import ParallelGQAttention

        trainer = super()._build(model)
        for mod in trainer.local.modules():
            if isinstance(mod, ParallelGQAttention) and mod.replicas > 1:
                mod._kv_weight = lambda lin: lin.weight  # each replica keeps only its own query heads' share
        return trainer


class KVReplicasNotSummed(ReferenceStack):
    """Planted bug: a KV head replicated over tp / kv_heads ranks keeps each replica's own gradient (the
    share of its query heads) instead of their sum — the classic silent GQA bug under TP."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)  # the same refusals
        return _KVNotSummed(spec, layout, recipe)


class _ForgetsMomentum(ReferenceStackTrainer):
    def load(self, directory) -> None:
        super().load(directory)
        self.trainer.optimizer.state.clear()  # resumed parameters, a fresh optimizer


class ResumeForgetsMomentum(ReferenceStack):
    """Planted bug: resume restores the parameters but not the optimizer state (SGD's momentum restarts)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _ForgetsMomentum(spec, layout, recipe)


class _SumsReplicas(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        reduce, dp = trainer.sync.reduce, self.layout.dp

        def summed():  # the DP reduction sums the replicas' gradients and forgets to divide by dp
            reduce()
            for g in trainer.sync.grads:
                g.mul_(dp)
        trainer.sync.reduce = summed
        return trainer


class MixedMissingAverage(ReferenceStack):
    """Planted bug: in mixed precision the DP reduction sums the replicas' gradients (no average)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _SumsReplicas(spec, layout, recipe)


class _ShardOnlyAttention(ReferenceStackTrainer):
    def _build(self, model):
        from reference.models.sharding import ParallelGQAttention

        trainer = super()._build(model)
        for mod in trainer.local.modules():
            if isinstance(mod, ParallelGQAttention):
                mod.core = None  # each rank attends over its own shard only, at its shard's positions
        return trainer


class CPAttendsOverItsShardOnly(ReferenceStack):
    """Planted bug: under context parallelism each rank attends over its own tokens only (no ring)."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _ShardOnlyAttention(spec, layout, recipe)


class _NotReducedOverCP(ReferenceStackTrainer):
    def _build(self, model):
        groups = dict(self.groups)
        groups.pop("dp_cp", None)  # gradients reduced over dp only: each cp rank steps on its shard's gradient
        self.groups = groups
        return super()._build(model)


class CPGradientsNotReduced(ReferenceStack):
    """Planted bug: parameters replicated over cp, their gradients reduced over dp only."""

    def build(self, spec, layout, recipe, group=None):
        super().build(spec, layout, recipe, group)
        return _NotReducedOverCP(spec, layout, recipe)
