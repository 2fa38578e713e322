"""Resume the torch 3D stack (``harness.adapters.torch_3d``: DTensor TP + pipelining + FSDP2) through
``torch.distributed.checkpoint`` (DCP) on another layout.

Keys are the dense model's names (each stage's local FQNs renamed, as torchtitan's pipeline split keeps
global FQNs), so a stage split that changes with pp finds its tensors: ``model.<name>`` for a parameter,
``optim.<name>.momentum_buffer`` for its SGD momentum, each the rank's DTensor (DCP reshards between
placements). Loading fills new DTensors of the new layout in place, then installs the momentum."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from harness.resume.case import BATCH, batch, continue_beside_one_device
from harness.threed.case import LR, SEQ, bound, differences
from reference.models import GPT


def _state(trainer) -> dict:
    out = {}
    for local, p in trainer.stage.named_parameters():
        name = trainer.names[local]
        out[f"model.{name}"] = p.data
        buf = trainer.optimizer.state.get(p, {}).get("momentum_buffer")
        out[f"optim.{name}.momentum_buffer"] = buf if buf is not None else torch.zeros_like(p.data)
    return out


def _trainer(dims_t, schedule: str, seed: int):
    from harness.adapters.torch_3d import Torch3D

    torch.manual_seed(seed)
    model = GPT()
    dp, pp, tp = dims_t
    return model, Torch3D(copy.deepcopy(model), dp, pp, tp, schedule, pp, LR)


def train_and_save(path: str, dims_t, schedule: str, steps: int, seed: int = 0) -> dict:
    import torch.distributed.checkpoint as dcp

    try:
        model, trainer = _trainer(dims_t, schedule, seed)
    except NotImplementedError as exc:
        return {"refused": str(exc)}
    for step in range(steps):
        trainer.step(*batch(step, model, seed))
    dcp.save(_state(trainer), checkpoint_id=path)
    return {"refused": None}


def resume_and_compare(path: str, dims_t, schedule: str, done: int, more: int, seed: int = 0) -> dict:
    """Load on layout ``dims_t``, train ``more`` steps, compare every full parameter with one device."""
    import torch.distributed.checkpoint as dcp

    model, trainer = _trainer(dims_t, schedule, seed)
    state = _state(trainer)
    try:
        dcp.load(state, checkpoint_id=path)
    except Exception as exc:  # the outcome is the suite's: reported, never a harness crash
        return {"error": f"dcp.load: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", "problems": []}
    with torch.no_grad():
        for local, p in trainer.stage.named_parameters():
            name = trainer.names[local]
            p.data.copy_(state[f"model.{name}"])
            trainer.optimizer.state[p] = {"momentum_buffer": state[f"optim.{name}.momentum_buffer"]}
    dense = dict(continue_beside_one_device(model, trainer, done, more, seed)[0].named_parameters())
    limit = bound(done + more, BATCH * SEQ, model, dist.get_world_size())
    worst, problems = differences([(name, p, dense[name]) for name, p in trainer.full_params().items()], limit)
    return {"error": None, "worst": worst, "bound": limit, "problems": problems}
