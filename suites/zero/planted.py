"""Planted bugs in subclasses of the reference: each must make the conformance check fail."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from reference.data_parallel import NaiveDataParallel
from reference.zero.adapter import ReferenceZero, _Trainer
from reference.zero.flat import FlatParams
from reference.zero.masked import counted_elements, counted_rows
from reference.zero.optim import StepRecipe
from reference.zero.sharded_optimizer import ShardedOptimizer


class _SumsInsteadOfAverages(NaiveDataParallel):
    """Bug: the gradients are all-reduced but never divided by the group size."""

    def finish(self) -> None:
        for p in self.module.parameters():
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(p.grad, group=self.group)


class _ShiftedShard(ShardedOptimizer):
    """Bug: each rank's gradient range starts one element late (an off-by-one shard boundary)."""

    def reduce(self) -> None:
        flat = self.flat
        grads = flat.flatten_grads()
        if flat.n > 1:
            dist.all_reduce(grads, group=self.group)
        shifted = torch.cat([grads / flat.n, grads.new_zeros(1)])[flat.shard.start + 1:flat.shard.stop + 1]
        for p in flat.params:
            p.grad = None
        self.master.grad = shifted


def _stage0(model, optimizer, group, data_parallel):
    """The reference's stage-0 trainer with ``data_parallel`` (a NaiveDataParallel with a bug) in it."""
    trainer = _Trainer(model, optimizer, 0, group, bucketed=False, bucket_bytes=1)
    trainer.ddp = data_parallel(model, group)
    return trainer


class MissingAverage(ReferenceZero):
    """Planted bug: stage 0 with the gradients summed over ranks, never averaged."""

    def build(self, model, optimizer, stage, group=None):
        return _stage0(model, optimizer, group, _SumsInsteadOfAverages)


class ShiftedShardBoundary(ReferenceZero):
    """Planted bug: ZeRO-2 whose gradient shard starts one element late on every rank."""

    def build(self, model, optimizer, stage, group=None):
        trainer = _Trainer(model, optimizer, 0, group, bucketed=False, bucket_bytes=1)
        trainer.stage, trainer.engine = 2, _ShiftedShard(model, optimizer, 2, group)
        trainer.optimizer = trainer.engine.optimizer
        return trainer


class _StaleOnRankOne(NaiveDataParallel):
    """Bug: rank 1 does not receive the average; it keeps its own gradient (its replica drifts)."""

    def finish(self) -> None:
        if dist.get_rank(self.group) != 1:
            super().finish()
        else:  # takes part in the collectives so nobody hangs, then throws the result away
            mine = [p.grad.clone() for p in self.module.parameters()]
            super().finish()
            for p, g in zip(self.module.parameters(), mine, strict=True):
                p.grad.copy_(g)


class RankOneDrifts(ReferenceZero):
    """Planted bug: every rank but 1 trains like one device; rank 1's replica drifts (only its own view
    shows it)."""

    def build(self, model, optimizer, stage, group=None):
        return _stage0(model, optimizer, group, _StaleOnRankOne)


class StepRaises(ReferenceZero):
    """Planted bug: the trainer's step raises (on every rank, before any collective)."""

    def build(self, model, optimizer, stage, group=None):
        trainer = super().build(model, optimizer, stage, group)

        def step(x, y):
            raise RuntimeError("optimizer state on the wrong device")

        trainer.step = step
        return trainer


class _AveragedTwice(_Trainer):
    """Bug: each micro-step's loss is divided by k, and the accumulated gradient by k once more."""

    def step(self, x, y) -> float:
        self.ddp.zero_grad()
        micro = self.recipe.split(x, y)
        for xm, ym in micro:
            (torch.nn.functional.mse_loss(self.model(xm), ym) / len(micro)).backward()
        for p in self.model.parameters():
            p.grad /= len(micro)
        self.ddp.finish()
        self.grad_bytes = 0
        self.optimizer.step()
        return 0.0


class AveragesMicroStepsTwice(ReferenceZero):
    """Planted bug: gradient accumulation averaging over the micro-steps twice (stage 0)."""

    def build(self, model, optimizer, stage, group=None, *, recipe=None):
        trainer = _AveragedTwice(model, optimizer, 0, group, bucketed=False, bucket_bytes=1, recipe=recipe)
        trainer.ddp = NaiveDataParallel(model, group)
        return trainer


class LastRankStepRaises(ReferenceZero):
    """Planted: the trainer's step raises on the last rank only; the others block in the gradient reduction."""

    def build(self, model, optimizer, stage, group=None):
        trainer = super().build(model, optimizer, stage, group)
        if dist.get_rank(group) == dist.get_world_size(group) - 1:
            def step(x, y):
                raise ValueError("bucket size not divisible on the last rank")

            trainer.step = step
        return trainer


@dataclasses.dataclass(frozen=True)
class _MeanPerMicroStepRecipe(StepRecipe):
    """Bug: each micro-step's loss is the mean over its own counted rows, averaged over the micro-steps."""

    def micro_loss(self, out, y, share):
        if not self.masked:
            return super().micro_loss(out, y, share)
        keep = counted_rows(y)
        return torch.nn.functional.mse_loss(out[keep], y[keep]) / self.accumulation


@dataclasses.dataclass(frozen=True)
class _MeanPerRankRecipe(StepRecipe):
    """Bug: each rank divides by its own count (never all-reduced), the group averaging the ranks' means."""

    def share(self, y, group=None):
        return float(counted_elements(y)) if self.masked else None


class _PlantedRecipe(ReferenceZero):
    recipe_class = StepRecipe

    def build(self, model, optimizer, stage, group=None, *, recipe=None):
        fields = dataclasses.asdict(recipe or StepRecipe())
        return super().build(model, optimizer, stage, group, recipe=self.recipe_class(**fields))


class MeanPerMicroStep(_PlantedRecipe):
    """Planted bug: on a padded batch, the per-micro-step mean averaged over micro-steps (right on full ones)."""

    recipe_class = _MeanPerMicroStepRecipe


class MeanPerRank(_PlantedRecipe):
    """Planted bug: on a padded batch, the per-rank mean averaged over ranks (right on full ones)."""

    recipe_class = _MeanPerRankRecipe


class _NoReplicaReduction(FlatParams):
    """Hybrid sharding's bug (pytorch #154888's (n, 1) mesh, verl #7493's fsdp_size 1): each shard reduced within its
    replica only — never across the replicas — and averaged over the shard group."""

    def reduce_scatter_mean(self, flat, divisor=None):
        replicas, self.replicas = self.replicas, 1
        try:
            return super().reduce_scatter_mean(flat, divisor)
        finally:
            self.replicas = replicas


class _DividesByWorld(FlatParams):
    """Hybrid sharding's other bug: the shard group's sum divided by the world size, the replicas never summed."""

    def reduce_scatter_mean(self, flat, divisor=None):
        replicas, self.replicas = self.replicas, 1
        try:
            return super().reduce_scatter_mean(flat, divisor or self.n * replicas)
        finally:
            self.replicas = replicas


class _PlantedHybrid(ReferenceZero):
    flat_class = FlatParams

    def build(self, model, optimizer, stage, group=None, *, recipe=None, replicate=None):
        trainer = super().build(model, optimizer, stage, group, recipe=recipe, replicate=replicate)
        engine = trainer.engine
        for flat in ([u.flat for u in engine.units] if stage == 3 else [engine.flat] if engine else []):
            flat.__class__ = self.flat_class
        return trainer


class NoReplicaReduction(_PlantedHybrid):
    """Planted bug: hybrid sharding that never reduces across the replicas."""

    flat_class = _NoReplicaReduction


class DividesByWorld(_PlantedHybrid):
    """Planted bug: hybrid sharding dividing the shard group's sum by the world size."""

    flat_class = _DividesByWorld


class _FirstMicroStepOnly(_Trainer):
    """DeepSpeed PR 7967's bug (offloaded ZeRO 1/2, a year and a half): only the first micro-step's gradients reach
    the host copy the offloaded optimizer steps from — the later micro-batches lost, the norm underestimated."""

    def step(self, x, y) -> float:
        micro = self.recipe.split(x, y)
        if len(micro) == 1:
            return super().step(x, y)
        first = micro[0]
        self.engine.zero_grad()
        share = self.recipe.share(y, self.group)
        loss = self.recipe.micro_loss(self.model(first[0]), first[1], share)
        loss.backward()
        self.engine.reduce()
        self.grad_bytes = 0
        shards = [self.engine.master] if self.stage < 3 else [u.shard for u in self.engine.units]
        self._clip(shards, shards)
        self.engine.update()
        return float(loss.detach())


class OffloadKeepsFirstMicroStep(ReferenceZero):
    """Planted bug: an offloading ZeRO 1/2 whose host copy keeps only the first micro-step's gradients."""

    def build(self, model, optimizer, stage, group=None, *, recipe=None, replicate=None, offload=False):
        trainer = super().build(model, optimizer, stage, group, recipe=recipe, replicate=replicate)
        trainer.__class__ = _FirstMicroStepOnly
        return trainer


class FlatShardDecayedWhole(ReferenceZero):
    """Planted bug: ZeRO 1-3's AdamW stepping each flat shard as one tensor (torch's AdamW over it): every element
    decays, the biases and norms laid beside the matrices too — the flat optimizer AdamW's rule needs per-element
    masks (or per-group flats, as DeepSpeed keeps) for."""

    def build(self, model, optimizer, stage, group=None, **kwargs):
        trainer = super().build(model, optimizer, stage, group, **kwargs)
        if optimizer.name == "adamw" and trainer.engine is not None:
            shards = [trainer.engine.master] if stage < 3 else [u.shard for u in trainer.engine.units]
            trainer.engine.optimizer = trainer.optimizer = torch.optim.AdamW(
                shards, lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps, weight_decay=optimizer.weight_decay)
        return trainer


class _ShardNormClip(_Trainer):
    """Bug: at ZeRO 1-3 each rank clips its shard by that shard's own norm — the squares never summed over the
    group (each rank's norm is part of the whole's, so each clips less, and by its own factor)."""

    def _clip(self, params, dp_sharded) -> None:
        from reference.clipping import clip_grad_norm_

        if self.recipe.max_grad_norm is None or not dp_sharded:
            return super()._clip(params, dp_sharded)
        self.last_grad_norm = float(clip_grad_norm_(params, self.recipe.max_grad_norm, {}, self.recipe.norm_type,
                                                    dp_sharded=dp_sharded))


class ClipsByShardNorm(ReferenceZero):
    """Planted bug: ZeRO 1-3 clipping each rank's shard by its own norm, not the model's global one."""

    def build(self, model, optimizer, stage, group=None, **kwargs):
        trainer = super().build(model, optimizer, stage, group, **kwargs)
        trainer.__class__ = _ShardNormClip
        return trainer
