"""The data-parallel / ZeRO contract (harness/contracts/zero.py) on the reference: stage 0 is
``BucketedDataParallel`` (or ``NaiveDataParallel``), stages 1-2 ``ShardedOptimizer``, stage 3 ``Zero3``.
A ``StepRecipe``: gradient accumulation (stage 0: the buckets skip the first k - 1 backward passes,
``no_sync``; stages 1-2: the gradients accumulate in ``.grad`` and are reduce-scattered once; stage 3:
each micro-step's reduce-scattered shard adds to the last) and global-norm clipping after the reduction
(``reference.clipping``: a stage-0 gradient is the same on every rank, counted once; a shard is this
rank's part)."""

from __future__ import annotations

import contextlib

from torch import nn

from ..clipping import clip_grad_norm_
from ..data_parallel import BucketedDataParallel, NaiveDataParallel
from .accounting import held_bytes, optimizer_state_tensors
from .optim import OptimizerSpec, StepRecipe
from .sharded_optimizer import ShardedOptimizer
from .stage3 import Zero3


class ReferenceZero:
    def __init__(self, bucketed: bool = True, bucket_bytes: int = 1 << 20):
        self.bucketed, self.bucket_bytes = bucketed, bucket_bytes

    def build(self, model: nn.Module, optimizer: OptimizerSpec, stage: int, group=None, *,
              recipe: StepRecipe | None = None, replicate: int | None = None, offload: bool = False):
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}.")
        if offload:
            from ..errors import Unsupported

            raise Unsupported("the reference keeps its sharded state on the rank's device (no offload path).")
        groups = hybrid_groups(group, replicate, stage)
        return _Trainer(model, optimizer, stage, group, self.bucketed, self.bucket_bytes, recipe or StepRecipe(),
                        groups)


def hybrid_groups(group, replicate: int | None, stage: int):
    """(shard group, replicate group) of hybrid sharding — ``group``'s N ranks as a replicate x (N / replicate)
    mesh, consecutive ranks sharding together (torch's ``init_device_mesh((replicate, shard))``; replicate 1: the
    (1, N) mesh, one replica, each rank its own replicate group) — or (None, None) without it. Collective over the
    world (``new_group``)."""
    import torch.distributed as dist

    n = dist.get_world_size(group)
    if replicate is None:
        return None, None
    if not isinstance(replicate, int) or replicate < 1 or n % replicate:
        raise ValueError(f"replicate ({replicate!r}) must be a whole number dividing the {n} ranks.")
    if stage == 0:
        raise ValueError("hybrid sharding shards within each replica: stage 0 shards nothing (plain data "
                         "parallelism already replicates).")
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    shard = n // replicate
    mine = ranks.index(dist.get_rank())
    shard_group = replicate_group = None
    for i in range(replicate):  # every rank creates every group, in the same order
        g = dist.new_group(ranks[i * shard:(i + 1) * shard])
        shard_group = g if mine // shard == i else shard_group
    for j in range(shard):
        g = dist.new_group(ranks[j::shard])
        replicate_group = g if mine % shard == j else replicate_group
    return shard_group, replicate_group


class _Trainer:
    def __init__(self, model, spec, stage, group, bucketed, bucket_bytes, recipe=None, groups=(None, None)):
        self.model, self.spec, self.stage, self.group = model, spec, stage, group
        shard_group, replicate = groups  # hybrid sharding: shard within shard_group, all-reduce across replicate
        self.shard_group = shard_group if shard_group is not None else group
        self.recipe = recipe or StepRecipe()
        self.last_grad_norm: float | None = None
        self.names = [name for name, _ in model.named_parameters()]
        if stage == 0:
            self.ddp = (BucketedDataParallel(model, group, bucket_bytes) if bucketed
                        else NaiveDataParallel(model, group))
            self.engine = None
            self.optimizer = spec.build(model.parameters())
        else:
            self.engine = (Zero3(model, spec, self.shard_group, replicate=replicate) if stage == 3
                           else ShardedOptimizer(model, spec, stage, self.shard_group, replicate=replicate))
            self.optimizer = self.engine.optimizer

    def step(self, x, y) -> float:
        (self.ddp if self.stage == 0 else self.engine).zero_grad()
        micro, total, share = self.recipe.split(x, y), 0.0, self.recipe.share(y, self.group)
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            quiet = self.ddp.no_sync() if self.stage == 0 and not last and hasattr(self.ddp, "no_sync") else None
            with quiet or contextlib.nullcontext():
                loss = self.recipe.micro_loss(self.model(xm), ym, share)  # / k, or masked: / its share
                loss.backward()
            total += float(loss.detach())
        if self.stage == 0:
            self.ddp.finish()
            self.grad_bytes = held_bytes(p.grad for p in self.model.parameters())
            self._clip(list(self.model.parameters()), ())
            self.optimizer.step()
        else:
            self.engine.reduce()
            self.grad_bytes = held_bytes(self.engine.grad_tensors())
            shards = [self.engine.master] if self.stage < 3 else [u.shard for u in self.engine.units]
            self._clip(shards, shards)
            self.engine.update()
        return total

    def _clip(self, params, dp_sharded) -> None:
        if self.recipe.max_grad_norm is not None:
            # a shard's square counted once: over the group that shards it (replicas hold the same shards)
            group = self.shard_group if dp_sharded else self.group
            norm = clip_grad_norm_(params, self.recipe.max_grad_norm, {"dp": group}, self.recipe.norm_type,
                                   dp_sharded=dp_sharded)
            self.last_grad_norm = float(norm)

    def _named(self, tensors) -> dict:
        return dict(zip(self.names, tensors, strict=True))

    def full_params(self) -> dict:
        if self.stage == 3:
            return self._named(self.engine.full_params())
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def full_grads(self) -> dict:
        if self.stage == 0:
            return {name: p.grad.clone() for name, p in self.model.named_parameters()}
        return self._named(self.engine.full_grads())

    def full_optimizer_state(self) -> dict:
        if self.stage == 0:
            return {name: {k: self.optimizer.state[p][k].clone() for k in self.spec.state_keys}
                    for name, p in self.model.named_parameters()}
        state = self.engine.full_state()
        return {name: {k: state[k][i] for k in self.spec.state_keys} for i, name in enumerate(self.names)}

    def memory(self) -> dict:
        params = list(self.model.parameters())
        held_params = params + ([u.shard for u in self.engine.units] if self.stage == 3 else [])
        return {"params": held_bytes(held_params), "grads": self.grad_bytes,
                "optimizer": held_bytes(optimizer_state_tensors(self.optimizer))}
