"""The resume conformance case (rank side): a GPT trained k steps on layout A, saved, loaded on layout B
(another world size, dp / pp / tp, ZeRO stage or schedule), trained j more steps — against one device
trained k + j steps on the same batches (computed on every rank), every rank's parameters compared."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.threed.case import LR, SEQ, _groups, bound, differences
from harness.verdict import refusal
from reference.mixed_precision import DynamicLossScaler
from reference.models import GPT
from reference.resume import latest
from reference.resume.threed import load_3d, save_3d
from reference.stack.compose import parallelize, shard_stages
from reference.stack.topology import ParallelDims
from reference.zero import OptimizerSpec

BATCH = 8
"""Global batch rows per step, the same for every layout (dp x microbatches divides it: m = pp)."""


@dataclass(frozen=True)
class Recipe:
    """What is trained, besides the layout: dropout probability (keyed masks), the optimizer, and a
    dynamic loss scaler growing every ``growth_interval`` steps (None: no scaler)."""

    dropout: float = 0.0
    optimizer: str = "sgd"
    growth_interval: int | None = None
    tie: bool = False
    """The embedding tied to the LM head (two copies under PP, kept equal)."""

    def spec(self) -> OptimizerSpec:
        return OptimizerSpec(self.optimizer, LR)

    def scaler(self) -> DynamicLossScaler | None:
        if self.growth_interval is None:
            return None
        return DynamicLossScaler(2.0**10, growth_interval=self.growth_interval)

    def allowance(self, steps: int, limit: float, gmax: float) -> float:
        """The absolute difference Adam may add beyond ``limit`` x magnitude: its update
        lr m_hat / (sqrt(v_hat) + eps) changes by at most lr |dg| / eps for a gradient change dg, and
        gradients that are zero mathematically (a key bias: softmax ignores a shift) come out as
        rounding noise whose sign Adam normalizes into an update of up to lr |g| / eps; with
        |dg| <= limit x the largest gradient (``gmax``, one device's), over ``steps`` steps. SGD: 0."""
        return 0.0 if self.optimizer == "sgd" else steps * LR * limit * gmax / self.spec().eps

    def model(self, seed: int) -> GPT:
        torch.manual_seed(seed)
        return GPT(dropout=self.dropout, dropout_seed=seed + 7, tie_embeddings=self.tie)


def one_device_step(single: GPT, opt, scaler: DynamicLossScaler | None, step: int, tokens, targets) -> float:
    """One device's training step ``step`` under the same recipe: keyed dropout, scaled loss, unscaled
    gradients, the step skipped on an inf or NaN. Returns the largest gradient magnitude."""
    single.dropout_key.step = step
    opt.zero_grad()
    scale = scaler.scale if scaler is not None else 1.0
    (single.loss(tokens, targets) * scale).backward()
    if scaler is not None:
        grads = [p.grad for p in single.parameters()]
        for g in grads:
            g.mul_(1.0 / scale)
        if not scaler.update_from(grads, {}):
            return 0.0
    opt.step()
    return max(float(p.grad.abs().max()) for p in single.parameters())


def batch(step: int, model: GPT, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    return (torch.randint(0, model.vocab, (BATCH, SEQ), generator=gen),
            torch.randint(0, model.vocab, (BATCH, SEQ), generator=gen))


def continue_beside_one_device(model: GPT, trainer, done: int, more: int, seed: int,
                               recipe: Recipe = Recipe()) -> tuple[GPT, DynamicLossScaler | None, float]:
    """One device trained ``done + more`` steps on the step-indexed batches while ``trainer`` (resumed at
    ``done``) trains the last ``more``; returns the one-device model, its loss scaler and the largest
    gradient magnitude it saw."""
    single = copy.deepcopy(model)
    opt, scaler, gmax = recipe.spec().build(single.parameters()), recipe.scaler(), 0.0
    for step in range(done + more):
        tokens, targets = batch(step, model, seed)
        gmax = max(gmax, one_device_step(single, opt, scaler, step, tokens, targets))
        if step >= done:
            trainer.step(tokens, targets)
    return single, scaler, gmax


def _trainer(dims_t, schedule: str, zero: int, seed: int, recipe: Recipe):
    dims = ParallelDims(*dims_t)
    model = recipe.model(seed)
    return model, parallelize(copy.deepcopy(model), dims, schedule, zero, False, groups=_groups(dims),
                              optimizer=recipe.spec(), microbatches=dims.pp, loss_scaler=recipe.scaler())


def train_and_save(root: str, dims_t, schedule: str, zero: int, steps: int, seed: int = 0,
                   crash: tuple[int, int] | None = None, recipe: Recipe = Recipe()) -> None:
    """Layout A: ``steps`` steps, then save ``step-<steps>``. ``crash`` (rank, extra steps): train that many
    more and die in the middle of saving them (that rank exits after writing its file)."""
    model, trainer = _trainer(dims_t, schedule, zero, seed, recipe)
    for step in range(steps):
        trainer.step(*batch(step, model, seed))
    save_3d(root, f"step-{steps}", trainer, {"step": steps, "layout": list(dims_t), "zero": zero})
    if crash:
        victim, extra = crash
        for step in range(steps, steps + extra):
            trainer.step(*batch(step, model, seed))
        save_3d(root, f"step-{steps + extra}", trainer, {"step": steps + extra}, _die_after_write=victim)


def resume_and_compare(root: str, dims_t, schedule: str, zero: int, more: int, seed: int = 0,
                       recipe: Recipe = Recipe()) -> dict:
    """Layout B: load the latest step, train ``more`` steps, compare with one device (and the loss
    scaler's state with one device's)."""
    try:
        model, trainer = _trainer(dims_t, schedule, zero, seed, recipe)
        meta = load_3d(latest(root), trainer)
    except ValueError as exc:  # a layout this model cannot take, a checkpoint it cannot take: one sentence
        return refusal(str(exc), step=None, worst=0.0)
    done = meta["step"]
    single, scaler, gmax = continue_beside_one_device(model, trainer, done, more, seed, recipe)
    return {"step": done, **_compare(trainer, single, scaler, done + more, recipe, gmax)}


def overflow_skipped_everywhere(dims_t, schedule: str, zero: int, victim: int, at_step: int, steps: int = 3,
                                seed: int = 0) -> dict:
    """Global rank ``victim``'s gradient of its first parameter turns inf at step ``at_step`` (under the
    loss scaler): every rank must skip that step and back the scale off, as one device whose gradient
    turns inf at the same step does."""
    recipe = Recipe(0.1, "sgd", growth_interval=100)
    model, trainer = _trainer(dims_t, schedule, zero, seed, recipe)
    single, inf = copy.deepcopy(model), float("inf")
    if dist.get_rank() == victim:
        next(trainer.local.parameters()).register_hook(lambda g: g * inf if trainer.steps_done == at_step else g)
    next(single.parameters()).register_hook(lambda g: g * inf if single.dropout_key.step == at_step else g)
    opt, scaler, gmax = recipe.spec().build(single.parameters()), recipe.scaler(), 0.0
    for step in range(steps):
        tokens, targets = batch(step, model, seed)
        gmax = max(gmax, one_device_step(single, opt, scaler, step, tokens, targets))
        trainer.step(tokens, targets)
    return _compare(trainer, single, scaler, steps, recipe, gmax)


def _compare(trainer, single: GPT, scaler, steps: int, recipe: Recipe, gmax: float) -> dict:
    """This rank's parameters against one device's (its shard of them) and the loss scalers' states."""
    dims = trainer.dims
    expected = shard_stages(single, dims, dist.get_rank(), trainer.groups["tp"], len(trainer.stages))
    limit = bound(steps, BATCH * SEQ, single, dims.world_size)
    absolute = recipe.allowance(steps, limit, gmax)
    worst, problems = differences([(f"stage {s} {name}", p, q) for s, stage in trainer.stages.items()
                                   for (name, p), q in zip(stage.named_parameters(), expected[s].parameters(),
                                                           strict=True)], limit, absolute)
    if scaler is not None and trainer.loss_scaler.state_dict() != scaler.state_dict():
        problems.append(f"rank {dist.get_rank()} loss scaler {trainer.loss_scaler.state_dict()} != one device's "
                        f"{scaler.state_dict()}")
    return {"refused": None, "worst": worst, "bound": limit, "absolute": absolute, "problems": problems,
            "scaler": trainer.loss_scaler.state_dict() if trainer.loss_scaler is not None else None}
