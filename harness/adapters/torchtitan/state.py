"""torchtitan's parts and the one-device weights: loaded where a checkpoint load would put them (``materialise``,
FSDP x TP's strided shards included), read back whole, and its checkpoint (``ModelWrapper`` + ``OptimizersContainer``
through DCP: any layout reads it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.adapters.torchtitan.imports import v02
from harness.runtime.rank import rank_device


def materialise(parts, state: dict) -> None:
    """torchtitan's order after parallelizing a meta model: each part moved to the rank's device, its buffers
    initialised (the rotary cache; a tied embedding re-tied to the head), then the one-device weights ``state``
    (torchtitan's names) loaded where a checkpoint load would put them; on gloo, FSDP2's reduction forced to a plain
    sum."""
    for part in parts:
        part.to_empty(device=rank_device())
        with torch.no_grad():
            part.init_weights(buffer_device=None)
            _load_full(part, state)
    if dist.get_backend() == "gloo":  # gloo has no PREMUL_SUM, which torchtitan's divide factor 1 makes FSDP2 use
        from torch.distributed.fsdp import FSDPModule

        for module in (m for part in parts for m in part.modules()):
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)  # the same sum, the factor (1) applied apart


def _scalar(t) -> float:
    return float(_full(t))


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def _model_wrapper():
    """torchtitan's ``ModelWrapper`` (0.3: ``components.checkpointer.base``; 0.2: ``components.checkpoint``)."""
    if v02():
        from torchtitan.components.checkpoint import ModelWrapper
    else:
        from torchtitan.components.checkpointer.base import ModelWrapper
    return ModelWrapper


def _save(trainer, directory) -> None:
    """torchtitan's checkpoint contents (``CheckpointManager``'s "model" and "optimizer": its ``ModelWrapper``
    and ``OptimizersContainer`` state dicts, FQN-keyed; its "lr_scheduler") through DCP — any layout reads it."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(trainer), checkpoint_id=str(directory))


def _load(trainer, directory) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(_states(trainer), checkpoint_id=str(directory))


def _states(trainer) -> dict:
    """What its ``CheckpointManager`` keeps: "model", "optimizer" and, where a schedule runs, "lr_scheduler" (its
    ``LRSchedulersContainer``: the position; each group's lr is the optimizer's own, loaded with it)."""
    ModelWrapper = _model_wrapper()  # noqa: N806 - torchtitan's class
    model = ModelWrapper(trainer.trainer)  # built first (a fresh trainer builds here): its schedulers with it
    scheduler = getattr(trainer, "lr_schedulers", None)
    return {"model": model, "optimizer": trainer.optimizers,
            **({"lr_scheduler": scheduler} if scheduler is not None else {})}


def _load_full(part, state: dict) -> None:
    """Each parameter of ``part`` (a DTensor shard, or a whole tensor), and each buffer ``state`` names, set to
    its one-device value: the full tensor replicated on the parameter's mesh, redistributed to its placements
    (torch 2.13's full-state-dict load, ``set_model_state_dict``, cannot place FSDP x TP's _StridedShard:
    distribute_tensor asserts)."""
    from torch.distributed.tensor import DTensor, Replicate

    params = ((name, p, True) for name, p in part.named_parameters())
    buffers = ((name, b, False) for name, b in part.named_buffers())  # those ``state`` names (a selection bias)
    for name, p, required in (*params, *buffers):
        key = name.replace("_checkpoint_wrapped_module.", "")
        if not required and key not in state:
            continue
        full = state[key]
        if isinstance(p, DTensor):
            whole = DTensor.from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
            p.to_local().copy_(whole.redistribute(p.device_mesh, p.placements).to_local())
        else:
            p.copy_(full)
