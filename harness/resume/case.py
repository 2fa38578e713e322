"""The resume conformance case (rank side): a GPT trained k steps on layout A, saved, loaded on layout B
(another world size, dp / pp / tp, ZeRO stage or schedule), trained j more steps — against one device
trained k + j steps on the same batches (computed on every rank), every rank's parameters compared."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from harness.threed.case import LR, SEQ, _groups, bound
from reference.compose import parallelize, shard_stages
from reference.models import GPT
from reference.state import latest
from reference.state.threed import load_3d, save_3d
from reference.topology import ParallelDims
from reference.zero import OptimizerSpec

BATCH = 8
"""Global batch rows per step, the same for every layout (dp x microbatches divides it: m = pp)."""


def batch(step: int, model: GPT, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    return (torch.randint(0, model.vocab, (BATCH, SEQ), generator=gen),
            torch.randint(0, model.vocab, (BATCH, SEQ), generator=gen))


def continue_beside_one_device(model: GPT, trainer, done: int, more: int, seed: int) -> GPT:
    """One device trained ``done + more`` steps on the step-indexed batches while ``trainer`` (resumed at
    ``done``) trains the last ``more``; returns the one-device model."""
    single = copy.deepcopy(model)
    opt = OptimizerSpec("sgd", LR).build(single.parameters())
    for step in range(done + more):
        tokens, targets = batch(step, model, seed)
        opt.zero_grad()
        single.loss(tokens, targets).backward()
        opt.step()
        if step >= done:
            trainer.step(tokens, targets)
    return single


def differences(pairs, limit: float) -> tuple[float, list[str]]:
    """(largest difference relative to the expected tensor's magnitude, one line per one over ``limit``)
    over (label, got, expected) triples."""
    worst, problems = 0.0, []
    for label, p, q in pairs:
        p, q = p.detach(), q.detach()
        rel = float((p - q).abs().max() / max(float(q.abs().max()), 1e-300))
        worst = max(worst, rel)
        if not rel <= limit:
            problems.append(f"rank {dist.get_rank()} {label}: off by {rel:.3g} > {limit:.3g}")
    return worst, problems


def _trainer(dims_t, schedule: str, zero: int, seed: int):
    dims = ParallelDims(*dims_t)
    torch.manual_seed(seed)
    model = GPT()
    return model, parallelize(copy.deepcopy(model), dims, schedule, zero, False, groups=_groups(dims),
                              optimizer=OptimizerSpec("sgd", LR), microbatches=dims.pp)


def train_and_save(root: str, dims_t, schedule: str, zero: int, steps: int, seed: int = 0,
                   crash: tuple[int, int] | None = None) -> None:
    """Layout A: ``steps`` steps, then save ``step-<steps>``. ``crash`` (rank, extra steps): train that many
    more and die in the middle of saving them (that rank exits after writing its file)."""
    model, trainer = _trainer(dims_t, schedule, zero, seed)
    for step in range(steps):
        trainer.step(*batch(step, model, seed))
    save_3d(root, f"step-{steps}", trainer, {"step": steps, "layout": list(dims_t), "zero": zero})
    if crash:
        victim, extra = crash
        for step in range(steps, steps + extra):
            trainer.step(*batch(step, model, seed))
        save_3d(root, f"step-{steps + extra}", trainer, {"step": steps + extra}, _die_after_write=victim)


def resume_and_compare(root: str, dims_t, schedule: str, zero: int, more: int, seed: int = 0) -> dict:
    """Layout B: load the latest step, train ``more`` steps, compare with one device."""
    dims = ParallelDims(*dims_t)
    try:
        model, trainer = _trainer(dims_t, schedule, zero, seed)
    except ValueError as exc:  # a layout this model cannot take: refused before anything is read
        return {"refused": str(exc), "step": None, "worst": 0.0, "problems": []}
    meta = load_3d(latest(root), trainer)
    done = meta["step"]
    single = continue_beside_one_device(model, trainer, done, more, seed)
    expected = shard_stages(single, dims, dist.get_rank(), trainer.groups["tp"], 2 if schedule == "interleaved" else 1)
    limit = bound(done + more, BATCH * SEQ, model, dims.world_size)
    worst, problems = differences([(f"stage {s} {name}", p, q) for s, stage in trainer.stages.items()
                                   for (name, p), q in zip(stage.named_parameters(), expected[s].parameters(),
                                                           strict=True)], limit)
    return {"refused": None, "step": done, "worst": worst, "bound": limit, "problems": problems}
