"""Resuming a mixed-precision 3D trainer (rank side): its fp32 masters and their optimizer state are what
the checkpoint holds (``reference.resume.threed``), so a bf16 run saved on layout A resumes exactly —
on A itself bitwise as if never stopped, on another layout B with B's masters equal to the saved ones."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from harness.resume.case import batch
from harness.runtime.world import rank_device
from harness.threed.case import LR, _groups
from reference.models import GPT
from reference.resume import latest
from reference.resume.store import ResumeError, read_box, read_metadata
from reference.resume.threed import load_3d, save_3d, tensor_map
from reference.stack.compose import parallelize
from reference.stack.topology import ParallelDims
from reference.zero import OptimizerSpec


def _trainer(model: GPT, dims_t, zero: int, schedule: str):
    dims = ParallelDims(*dims_t)
    return parallelize(copy.deepcopy(model), dims, schedule, zero, False, groups=_groups(dims),
                       optimizer=OptimizerSpec("adam", LR), microbatches=dims.pp)


def _train(trainer, model: GPT, steps: range) -> None:
    for step in steps:
        tokens, targets = batch(step, model)
        trainer.step(tokens.to(rank_device()), targets.to(rank_device()))


def resume_mixed(root: str, a, zero_a: int, b, zero_b: int, done: int = 2) -> dict:
    """A (bf16, tied, keyed dropout, Adam) trains ``done`` steps, saves, trains one more; A again, resumed,
    trains that step: its masters and bf16 parameters must equal bitwise (the step reads the restored
    Adam moments and step count). B, resumed from the same
    checkpoint: every local master equal to the checkpoint's fp32 values, its parameters those rounded; a
    float64 trainer on B refuses it (``float64_refused``: the sentence)."""
    torch.manual_seed(0)
    model = GPT(dropout=0.1, tie_embeddings=True, dtype=torch.bfloat16).to(rank_device())
    first = _trainer(model, a, zero_a, "1f1b")
    _train(first, model, range(done))
    save_3d(root, f"step-{done}", first, {})
    _train(first, model, range(done, done + 1))
    again = _trainer(model, a, zero_a, "1f1b")
    load_3d(latest(root), again)
    _train(again, model, range(done, done + 1))
    pairs = [("master", first.sync.full_masters(), again.sync.full_masters()),
             ("bf16 parameter", list(first.local.parameters()), list(again.local.parameters()))]
    problems = [f"rank {dist.get_rank()} resumed on A: {what} {i} differs" for what, xs, ys in pairs
                for i, (x, y) in enumerate(zip(xs, ys, strict=True)) if not torch.equal(x, y)]
    if first.steps_done != again.steps_done:
        problems.append(f"steps_done {again.steps_done} != {first.steps_done}")
    other = _trainer(model, b, zero_b, "gpipe")
    ckpt = latest(root)
    load_3d(ckpt, other)
    metadata = read_metadata(ckpt)
    for (p, name, off, held, dense), master in zip(tensor_map(other), other.sync.full_masters(), strict=True):
        index = tuple(slice(0, n) for n in held)
        saved = read_box(ckpt, f"model/{name}", off, held, torch.float32, metadata, dense).to(master.device)
        if saved.dtype != torch.float32 or not torch.equal(master[index], saved):
            problems.append(f"rank {dist.get_rank()} on B: master {name} is not the saved fp32 value")
        if not torch.equal(p.detach()[index], saved.to(p.dtype)):
            problems.append(f"rank {dist.get_rank()} on B: {name} is not the saved master rounded")
    refused = None
    try:  # the store's dtype check: the fp32 masters are not a float64 model's parameters
        load_3d(ckpt, _trainer(copy.deepcopy(model).double(), b, zero_b, "gpipe"))
    except ResumeError as exc:
        refused = str(exc)
    return {"problems": problems, "steps_done": other.steps_done, "float64_refused": refused}
