"""Save and resume the reference 3D stack (``reference.stack.compose.Parallel3D``) on any layout.

What each rank holds, named as one device names it (``GPT.named_parameters()``):
- a parameter: its tensor-parallel box of the dense parameter (ColumnParallelLinear: rows from
  ``offset``; RowParallelLinear: columns from ``offset`` and a replicated bias; the vocabulary-parallel
  embedding and head: rows ``start:end``, the padding rows beyond the vocabulary never saved; LayerNorms
  replicated), in the stage's global block numbering;
- a Llama's KV head replicated over tp / kv_heads ranks (kv_heads < tp): its rows of the dense K / V weight,
  the same box on each replica;
- its optimizer state (``OptimizerSpec.state_keys``: SGD's momentum, Adam's moments) the same way.
The data-parallel replicas of a (pp, tp) coordinate hold the same parameters; each saves one range of
them — the range of the flat buffer ZeRO 1/2 shards, [r S, (r + 1) S) with S = ceil(numel / dp), so a
ZeRO rank writes exactly the optimizer state it owns (as DeepSpeed's ZeRO checkpoints), and stage 0 splits
the writing the same way. A range of a parameter is cut into boxes (``boxes.flat_range_to_boxes``).

Loading reads, for every local tensor of the new layout, its box (``store.read_box``): any dp, pp, tp,
ZeRO stage and schedule from any other.

``meta`` (in metadata.json) carries the rest of the training state: ``steps_done`` (the data position:
the batches are step-indexed), the RNG state and the loss scaler's state. The RNG policy per (dp, pp, tp)
coordinate is ``reference.dropout``'s: every dropout mask is a function of (seed, step, layer, site,
global sample) — no rank holds generator state of its own, so ``dropout_seed`` and ``steps_done`` are the
whole RNG state, valid on any layout (torch's global generators are not used by training and not saved).
``loss_scaler``: the dynamic loss scaler's scale and growth tracker (a trainer with a scaler refuses a
checkpoint without one; one without a scaler ignores it: unscaled training has no use for it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from reference.resume.boxes import flat_range_to_boxes
from reference.resume.store import Shard
from reference.tensor_parallel import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


def _dense_name(first_block: int, module_path: str) -> str:
    """A stage's parameter path -> the one-device name: global block numbers, no checkpointing wrapper
    (``module``), and GPT's ParallelMLP (``mlp.fc1``) flattened to the dense block's ``fc1`` (a Llama's
    ``mlp.gate`` stays: its dense block has an ``mlp``)."""
    parts = module_path.split(".")
    if parts[0] == "blocks":
        rest = [p for p in parts[2:] if p != "module"]
        rest = rest[1:] if rest[:1] == ["mlp"] and rest[1:2] in (["fc1"], ["fc2"]) else rest
        parts = ["blocks", str(first_block + int(parts[1])), *rest]
    return ".".join(parts)


def tensor_map(trainer) -> list[tuple[nn.Parameter, str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(local parameter, dense name, offsets in the dense tensor, lengths held (padding excluded), dense
    shape) for every parameter of this rank, in ``trainer.local.parameters()`` order."""
    entries = {}
    for s, stage in trainer.stages.items():
        first = trainer.block_bounds[s]
        for path, mod in stage.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                name = _dense_name(first, f"{path}.{pname}" if path else pname)
                shape, off = tuple(p.shape), (0,) * p.dim()
                if isinstance(mod, VocabParallelEmbedding | ParallelLMHead):
                    vocab = mod.num_embeddings if isinstance(mod, VocabParallelEmbedding) else mod.vocab_size
                    off, held, dense = (mod.start, 0), (mod.end - mod.start, shape[1]), (vocab, shape[1])
                elif isinstance(mod, ColumnParallelLinear):
                    tp = dist.get_world_size(mod.group)
                    dense = (shape[0] * tp, *shape[1:])
                    off, held = (mod.offset,) + (0,) * (p.dim() - 1), shape
                elif isinstance(mod, RowParallelLinear) and pname == "weight":
                    tp = dist.get_world_size(mod.group)
                    off, held, dense = (0, mod.offset), shape, (shape[0], shape[1] * tp)
                elif getattr(p, "kv_slot", None) is not None:  # a replicated KV head (Llama, kv_heads < tp)
                    slot, slots = p.kv_slot
                    off, held, dense = (slot * shape[0], 0), shape, (slots * shape[0], shape[1])
                else:  # replicated: LayerNorms, a row-parallel layer's bias
                    held, dense = shape, shape
                if getattr(p, "expert_of", None) is not None:  # an expert split over EP: its global number
                    local, expert = p.expert_of
                    name = name.replace(f".experts.{local}.", f".experts.{expert}.", 1)
                entries[id(p)] = (p, name, off, held, dense)
    return [entries[id(p)] for p in trainer.local.parameters()]


def _spread(part, tensor: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``part``'s parameters' view of a full flat tensor holding ``tensor``: this rank's ZeRO shard of
    the part's flat buffer (the rest zeros) or the whole of it."""
    flat = part.sync.flat
    if tensor.numel() == flat.padded:
        return flat.views(tensor)
    full = torch.zeros(flat.padded, dtype=tensor.dtype, device=tensor.device)
    full[flat.shard] = tensor
    return flat.views(full)


def _holder(trainer, part):
    """The tensor ``part``'s optimizer steps (its state's key) for a flat trainer: the fp32 master (mixed
    precision: the whole flat at ZeRO 0, else this rank's shard) or ZeRO 1/2's shard."""
    return part.sync.masters[0] if trainer.mixed else part.sync.master


def _flat(trainer) -> bool:
    """Whether the optimizers step flat masters (ZeRO 1/2, mixed precision), not the parameters themselves."""
    return bool(trainer.zero_stage) or trainer.mixed


def _in_local_order(trainer, per_part) -> list:
    """``per_part(part)`` (one value per parameter of the part, in its order) as one list in
    ``trainer.local.parameters()`` order."""
    by_id = {id(p): v for part in trainer.parts for p, v in zip(part.params, per_part(part), strict=True)}
    return [by_id[id(p)] for p in trainer.local.parameters()]


def _state_of(trainer, key: str) -> list[torch.Tensor | None]:
    """Each local parameter's optimizer state ``key`` as a tensor of its shape (flat views under ZeRO)."""
    def per_part(part):
        if not _flat(trainer):
            return [part.optimizer.state.get(p, {}).get(key) for p in part.params]
        held = part.optimizer.state.get(_holder(trainer, part), {}).get(key)
        return [None] * len(part.params) if held is None else _spread(part, held)

    return _in_local_order(trainer, per_part)


def _values(trainer) -> list[torch.Tensor]:
    """What is saved as each local parameter: the parameter, or in mixed precision its fp32 master (the
    low-precision parameter is the master rounded: the master is the training state)."""
    if trainer.mixed:
        return _in_local_order(trainer, lambda part: _spread(part, part.sync.masters[0].detach()))
    return [p.detach() for p in trainer.local.parameters()]


def rank_shards(trainer) -> list[Shard]:
    """This rank's share of the training state: its DP range of its local parameters and their state (an
    expert split over EP: its range among the expert's replicas, the expert-data-parallel group)."""
    entries = tensor_map(trainer)
    keys = trainer.spec.state_keys
    states = {key: _state_of(trainer, key) for key in keys}
    values = _values(trainer)
    shards = []
    if "step" in trainer.spec.extra_state and dist.get_rank() == 0:
        steps = [st["step"] for st in trainer.optimizer.state.values() if "step" in st]
        if steps:
            shards.append(Shard("optim/step", steps[0].detach().to(torch.float32).reshape(()), (), ()))
    experts = [getattr(p, "expert_of", None) is not None for p, *_ in entries]
    # dp x cp under context parallelism; hybrid sharding: its shard group (each replica holds every shard)
    dense_group = getattr(trainer, "zero_group", getattr(trainer, "dp_group", trainer.groups["dp"]))
    for group, take in ((dense_group, False), (trainer.groups.get("edp"), True)):
        mine = [i for i, e in enumerate(experts) if e == take]
        if mine:
            shards += _ranged(entries, mine, group, values, states, trainer.spec.state_keys_of)
    return shards


def _ranged(entries, which: list[int], group, values, states, keys_of) -> list[Shard]:
    """The shards of ``entries[which]`` (replicated over ``group``) this rank writes: its range [r S, (r + 1) S)
    of their flat numbering, S = ceil(numel / group size) — the range ZeRO 1/2 shards; of the state, each
    parameter's own keys (``keys_of(name, shape)``: a flat Muon's master holds every key of both its optimizers)."""
    dp, r = dist.get_world_size(group), dist.get_rank(group)
    numel = sum(entries[i][0].numel() for i in which)
    size = -(-numel // dp)
    lo, hi = r * size, min((r + 1) * size, numel)
    shards, base = [], 0
    for i in which:
        p, name, off, held, dense = entries[i]
        a, b = max(lo, base) - base, min(hi, base + p.numel()) - base
        base += p.numel()
        for box_off, box_len in flat_range_to_boxes(p.shape, a, b):
            # clip to what is held (the vocabulary padding rows are not the model's)
            clipped = [(o, min(o + n, h) - o) for o, n, h in zip(box_off, box_len, held, strict=True)]
            if any(n <= 0 for _, n in clipped):
                continue
            index = tuple(slice(o, o + n) for o, n in clipped)
            where = tuple(o + g for (o, _), g in zip(clipped, off, strict=True))
            shards.append(Shard(f"model/{name}", values[i][index].clone(), where, dense))
            for key in keys_of(name, dense):
                if states[key][i] is not None:
                    shards.append(Shard(f"optim/{key}/{name}", states[key][i].detach()[index].clone(), where, dense))
    return shards


def load_rank(trainer, read) -> None:
    """Fill this rank's parameters and optimizer state from the checkpoint: ``read(name, offsets, lengths,
    dtype, dense_shape)`` returns one box (``store.read_box`` bound to the checkpoint)."""
    entries = tensor_map(trainer)
    keys = trainer.spec.state_keys
    with torch.no_grad():
        state, values = {key: [] for key in keys}, []
        for p, name, off, held, dense in entries:
            index = tuple(slice(0, n) for n in held)
            dtype = torch.float32 if trainer.mixed else p.dtype  # mixed precision: the fp32 master
            full = torch.zeros_like(p.data, dtype=dtype)
            full[index] = read(f"model/{name}", off, held, dtype, dense)
            p.data.copy_(full)  # mixed precision: the master rounded, as each step writes it back
            values.append(full)
            own = trainer.spec.state_keys_of(name, dense)  # Muon's matrices a momentum, its AdamW's two moments
            for key in keys:
                full = torch.zeros_like(p.data, dtype=dtype)  # another optimizer's key: zeros in a flat master
                if key in own:
                    full[index] = read(f"optim/{key}/{name}", off, held, dtype, dense)
                state[key].append(full)
        if not _flat(trainer):
            for i, (p, name, _, _, dense) in enumerate(entries):
                trainer.optimizer.state[p] = {key: state[key][i] for key in trainer.spec.state_keys_of(name, dense)}
        else:
            index = {id(p): i for i, (p, *_) in enumerate(entries)}
            for data_part in trainer.parts:
                flat = data_part.sync.flat
                mine = flat.shard if trainer.zero_stage else slice(None)
                which = [index[id(p)] for p in data_part.params]

                def part(tensors, flat=flat, mine=mine):  # this rank's range of the flat layout (padding zeros)
                    pad = torch.zeros(flat.padded - flat.numel, dtype=tensors[0].dtype, device=tensors[0].device)
                    return torch.cat([t.flatten() for t in tensors] + [pad])[mine].clone()

                if trainer.mixed:
                    data_part.sync.masters[0].data.copy_(part([values[i] for i in which]))
                data_part.optimizer.state[_holder(trainer, data_part)] = {
                    key: part([state[key][i] for i in which]) for key in keys}
        if "step" in trainer.spec.extra_state:  # Adam's step count: one scalar for every parameter
            step = read("optim/step", (), (), torch.float32, ())
            for optimizer in trainer.optimizers:
                for st in optimizer.state.values():
                    st["step"] = step.clone()


def save_3d(root, step_name: str, trainer, meta: dict, group=None, _die_after_write: int | None = None):
    """Collective over ``group`` (default: the world): every rank writes its shards into one staging folder,
    rank 0 merges the metadata and publishes ``root/step_name``. ``_die_after_write``: that rank exits
    right after writing its file (the fault test's rank killed mid-save)."""
    import os
    import secrets
    from pathlib import Path

    from reference.resume.store import finalize, publish, write_rank

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    meta = {**meta, "versions": {"torch": torch.__version__.split("+")[0]}, "zero_stage": trainer.zero_stage,
            "dims": [trainer.dims.dp, trainer.dims.pp, trainer.dims.tp], "optimizer": trainer.spec.name,
            "steps_done": trainer.steps_done, "dropout_seed": trainer.dropout_key.seed,
            "tie_embeddings": trainer.tie_embeddings, "lr_updates": trainer.lr.taken,
            "loss_scaler": trainer.loss_scaler.state_dict() if trainer.loss_scaler is not None else None}
    name = [f".staging-{step_name}-{secrets.token_hex(4)}" if rank == 0 else None]
    dist.broadcast_object_list(name, src=src, group=group)
    staging = Path(root) / name[0]
    if rank == 0:
        staging.mkdir(parents=True)
    dist.barrier(group)
    write_rank(staging, rank, rank_shards(trainer))
    if _die_after_write == rank:
        os._exit(17)
    dist.barrier(group)
    status = [None]
    if rank == 0:
        try:
            finalize(staging, world, meta)
            publish(root, step_name, staging)
        except Exception as exc:  # every rank raises the same sentence, none waits forever
            status = [f"{type(exc).__name__}: {exc}"]
    dist.broadcast_object_list(status, src=src, group=group)
    if status[0]:
        raise RuntimeError(f"saving {step_name!r} failed on rank 0: {status[0]}")
    return Path(root) / step_name


def load_3d(ckpt, trainer) -> dict:
    """Fill ``trainer`` (any layout) from the published checkpoint folder ``ckpt``: parameters, optimizer
    state, steps done, dropout seed, loss scaler, the schedule's position; returns its ``meta``."""
    from reference.resume.store import ResumeError, read_box, read_metadata

    metadata = read_metadata(ckpt)
    meta = metadata["meta"]
    if bool(meta.get("tie_embeddings", False)) != trainer.tie_embeddings:
        have, want = ("ties", "an untied") if trainer.tie_embeddings else ("does not tie", "a tied")
        raise ResumeError(f"{ckpt}/metadata.json is from {want} model, and this trainer's model {have} its "
                          f"embedding to its LM head.")
    if trainer.lr.schedule is not None and "lr_updates" not in meta:
        raise ResumeError(f"{ckpt}/metadata.json holds no learning-rate schedule position (lr_updates), but this "
                          "trainer runs a schedule: it would restart its warmup.")
    if trainer.loss_scaler is not None and meta.get("loss_scaler") is None:
        raise ResumeError(f"{ckpt}/metadata.json holds no loss-scaler state, but this trainer scales its loss: "
                          f"resuming would restart the scale from {trainer.loss_scaler.scale:g}.")

    def read(name, offsets, lengths, dtype, dense):
        return read_box(ckpt, name, offsets, lengths, dtype=dtype, metadata=metadata, global_shape=dense)

    load_rank(trainer, read)
    trainer.lr.taken = int(meta.get("lr_updates", 0))  # the schedule's position: the updates taken
    trainer.steps_done = int(meta.get("steps_done", meta.get("step", 0)))
    trainer.dropout_key.seed = int(meta.get("dropout_seed", trainer.dropout_key.seed))
    if trainer.loss_scaler is not None:
        trainer.loss_scaler.load_state_dict(meta["loss_scaler"])
    return meta
