"""Planted bugs whose differences have a shape (``harness.localise.shape``), behind the stack contract: each is
found by the localisation at its minimal configuration, on its first diverging tensor, with its shape named."""

from __future__ import annotations

import torch.distributed as dist

from harness.adapters.reference.stack import ReferenceStack, ReferenceStackTrainer


def _planted(base, trainer, doc: str):
    class Planted(base):
        __doc__ = doc

        def build(self, spec, layout, recipe, group=None):
            super().build(spec, layout, recipe, group)  # the same refusals
            return trainer(spec, layout, recipe)
    return Planted


class _TpSummed(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        tied, tp = trainer._sum_tied, self.groups["tp"]
        from reference.resume.threed import tensor_map

        replicated = [p for p, _, offsets, held, dense in tensor_map(trainer)
                      if tuple(held) == tuple(dense) and not any(offsets)]

        def summed_over_tp():  # the replicated parameters' gradients summed over tp, never averaged
            tied()
            for p in replicated:
                dist.all_reduce(p.grad, group=tp)
        trainer._sum_tied = summed_over_tp
        return trainer


TpGradientsSummed = _planted(ReferenceStack, _TpSummed, "Planted bug: the gradients of parameters replicated over "
                             "TP (the norms) all-reduced over the TP group — a sum where they were already whole: a "
                             "missing average over tp.")


class _LocalRotary(ReferenceStackTrainer):
    def _build(self, model):
        from reference.context_parallel.attention import ContextParallelCore, attend_cp

        class LocalCore(ContextParallelCore):
            def __call__(self, q, k, v, positions=None):  # rotated at the shard's own positions 0 .. s/cp - 1
                return attend_cp(q, k, v, self.group, self.layout, self.theta, self.causal, self.algorithm,
                                 local_rotary=True)
        trainer = super()._build(model)
        for mod in trainer.local.modules():
            core = getattr(mod, "core", None)
            if isinstance(core, ContextParallelCore):
                local = LocalCore.__new__(LocalCore)
                local.__dict__.update(core.__dict__)
                mod.core = local
        return trainer


CPLocalRotary = _planted(ReferenceStack, _LocalRotary, "Planted bug: under context parallelism each rank rotates its "
                         "queries and keys at its shard's local positions, not the sequence's.")


class _DropsRemainderRow(ReferenceStackTrainer):
    def _build(self, model):
        from reference.tensor_parallel import VocabParallelEmbedding

        trainer = super()._build(model)
        for mod in trainer.local.modules():
            if isinstance(mod, VocabParallelEmbedding) and mod.end == mod.num_embeddings:
                n = dist.get_world_size(mod.group)
                mod.end -= mod.num_embeddings % n  # floor(V / n) rows per rank: the remainder row is never looked up
        return trainer


DroppedRemainderRow = _planted(ReferenceStack, _DropsRemainderRow, "Planted bug: the vocabulary split as floor(V / "
                               "tp) rows per rank — the remainder rows (V mod tp) dropped: their tokens embed to zero.")


class _Fc1Swapped(ReferenceStackTrainer):
    def _build(self, model):
        import torch

        from reference.tensor_parallel import ColumnParallelLinear

        trainer = super()._build(model)
        tp = dist.get_world_size(self.groups["tp"])
        for s, stage in trainer.stages.items():
            for i, block in enumerate(stage.blocks):
                block = getattr(block, "module", block)
                fc1 = getattr(getattr(block, "mlp", None), "fc1", None)
                if isinstance(fc1, ColumnParallelLinear) and tp > 1:
                    dense = model.blocks[trainer.block_bounds[s] + i].fc1
                    other = 0 if fc1.offset else fc1.out_per_rank * (tp - 1)  # the other end of the TP group
                    rows = slice(other, other + fc1.out_per_rank)
                    with torch.no_grad():
                        fc1.weight.copy_(dense.weight[rows])
                        fc1.bias.copy_(dense.bias[rows])
        return trainer


Fc1ShardsSwapped = _planted(ReferenceStack, _Fc1Swapped, "Planted bug: each MLP's first layer loaded with the rows of "
                            "the TP rank at the other end of the group (its second layer in order): shards in the "
                            "wrong rank order.")


class _MeanTimesCount(ReferenceStackTrainer):
    def _build(self, model):
        from harness.stack.inputs import IGNORE

        trainer = super()._build(model)

        def mean_times_count(summed, target, share):  # the micro-batch's mean re-weighted by its count: right on
            n = (target != IGNORE).sum()  # every micro-batch that counts something, 0 / 0 on one that counts nothing
            return summed / n * n / share
        trainer.normalise = mean_times_count
        return trainer


MeanTimesCount = _planted(ReferenceStack, _MeanTimesCount, "Planted bug: each micro-batch's loss is its mean times "
                          "its counted targets / the step's share — the global mean, except on a micro-batch that "
                          "counts nothing, where the mean is 0 / 0: the step's loss NaN (its gradients, masked by "
                          "the cross-entropy, stay 0).")


class _ReducedOnRootOnly(ReferenceStackTrainer):
    def _build(self, model):
        import torch.nn.functional as F

        from reference.tensor_parallel import RowParallelLinear

        trainer = super()._build(model)

        def partial_off_the_root(module, args, out):  # a reduce where an all-reduce was meant: the others keep
            y = F.linear(args[0], module.weight)  # their partial sums
            return y + module.bias if module.bias is not None else y
        if dist.get_rank(self.groups["tp"]) != 0:
            for mod in trainer.local.modules():
                if isinstance(mod, RowParallelLinear) and mod.input_is_parallel:
                    mod.register_forward_hook(partial_off_the_root)
        return trainer


ReducedOnTheRootOnly = _planted(ReferenceStack, _ReducedOnRootOnly, "Planted bug: a row-parallel layer's output summed "
                                "onto the TP group's root only (a reduce where an all-reduce was meant): the other "
                                "ranks carry on with their partial sums.")


class _Ascends(ReferenceStackTrainer):
    def _build(self, model):
        trainer = super()._build(model)
        update, params = trainer.reduction.update, list(trainer.local.parameters())

        def ascends():  # the optimizer's step applied with the wrong sign
            before = [p.detach().clone() for p in params]
            update()
            for p, b in zip(params, before, strict=True):
                p.data.copy_(2 * b - p.data)
        trainer.reduction.update = ascends
        return trainer


UpdateAscends = _planted(ReferenceStack, _Ascends, "Planted bug: every update applied with the wrong sign (gradient "
                         "ascent).")


def _torch_per_pass():
    from harness.adapters.torch.stack import TorchStack, TorchStackTrainer
    from harness.adapters.torch.stack_trainer import Torch3D

    class PerPass(Torch3D):
        @property
        def _count(self):  # each accumulation pass divides by its own share, not the step's
            return self.__dict__["_share"] / self.accumulation

        @_count.setter
        def _count(self, value):
            self.__dict__["_share"] = value

    class Trainer(TorchStackTrainer):
        def _build(self, model):
            trainer = super()._build(model)
            trainer.__class__ = PerPass
            return trainer

    class Stack(TorchStack):
        def build(self, spec, layout, recipe, group=None):
            super().build(spec, layout, recipe, group)
            return Trainer(spec, layout, recipe)
    return Stack


class TorchLossNotDividedByAccumulation:
    """Planted bug in torch's stack: each accumulation pass's loss divided by that pass's share of the counted
    targets, not the step's — every gradient x the accumulation steps."""

    def build(self, spec, layout, recipe, group=None):
        return _torch_per_pass()().build(spec, layout, recipe, group)


class _TitanNormsTimesTp:
    """Mixed into torchtitan's trainer: after each backward, the gradients of the norms (replicated over TP) x tp."""

    def _forward_backward(self, parts, tokens, targets, global_tokens) -> float:
        loss = super()._forward_backward(parts, tokens, targets, global_tokens)
        for part in parts:
            for name, p in part.named_parameters():
                if name.endswith("norm.weight") and p.grad is not None:
                    p.grad.mul_(self.layout.tp)
        return loss


class TitanNormsSummedOverTp:
    """Planted bug in torchtitan's stack: the norms' gradients (replicated over TP, already whole on each rank)
    summed over the TP group — x tp: a missing average over tp."""

    def build(self, spec, layout, recipe, group=None):
        from harness.adapters.torchtitan.stack import TorchtitanStack
        from harness.adapters.torchtitan.trainer import TorchtitanStackTrainer

        TorchtitanStack().build(spec, layout, recipe)  # the same refusals
        return type("NormsTimesTp", (_TitanNormsTimesTp, TorchtitanStackTrainer), {})(spec, layout, recipe)


class _Untraced(_TpSummed):
    def traced_modules(self):  # a stack that exposes nothing: localised on its dense state
        return {}

    traced_parameters = None


TpGradientsSummedUntraced = _planted(ReferenceStack, _Untraced, "TpGradientsSummed behind a stack that exposes no "
                                     "modules or parameters to trace.")
