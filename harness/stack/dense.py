"""How a stack adapter assembles its dense state (one device's names, every rank): the one precedence rule.

A rank reports what it holds as it holds it; what it does not hold it takes from the other ranks, the lowest
rank's copy first. So every copy of a replicated tensor is held to one device by the rank that holds it (a
replica that drifted fails on its own rank), and no rank's view hides another's. ``gathered`` applies the rule to
whole entries (a name -> its tensor, or its optimizer state); an adapter whose ranks hold boxes of one tensor
(the reference, Megatron) writes the other ranks' boxes first, in rank order, and its own last — the same rule.
``tied`` is the tied embedding's: one parameter under both names, its state once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist


def merged(everyone: list[dict], me: int) -> dict:
    """``everyone[me]``'s entries, completed with each other rank's in rank order (the lowest rank's first)."""
    out = dict(everyone[me])
    for part in everyone:
        for name, value in part.items():
            out.setdefault(name, value)
    return out


def gathered(mine: dict, group=None) -> dict:
    """``mine`` completed with every other rank's entries of ``group`` (``merged``)."""
    size = dist.get_world_size(group)
    if size == 1:
        return dict(mine)
    return merged(exchanged(mine, group), dist.get_rank(group))


def exchanged(obj, group=None) -> list:
    """``dist.all_gather_object`` of ``obj`` with its tensors sent as their bytes (dtype, shape, data; one record per
    tensor object, so two names of one tensor stay one tensor): torch's own pickling of a tensor rebuilds a storage
    per tensor on the way back, ~0.2 ms each — most of a stack's dense-state exchange."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, _packed(obj, {}), group=group)
    return [_unpacked(part, {}) for part in everyone]


class _Bytes(NamedTuple):
    dtype: str
    shape: tuple
    data: bytes


def _packed(obj, memo: dict):
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            t = obj.detach().cpu().contiguous()
            memo[id(obj)] = _Bytes(str(t.dtype).removeprefix("torch."), tuple(t.shape),
                                   t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return memo[id(obj)]
    if isinstance(obj, dict):
        return {k: _packed(v, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_packed(v, memo) for v in obj)
    return obj


def _unpacked(obj, memo: dict):
    import torch

    if isinstance(obj, _Bytes):
        if id(obj) not in memo:
            dtype = getattr(torch, obj.dtype)
            memo[id(obj)] = (torch.frombuffer(bytearray(obj.data), dtype=torch.uint8).view(dtype).reshape(obj.shape)
                             if obj.data else torch.empty(obj.shape, dtype=dtype))
        return memo[id(obj)]
    if isinstance(obj, dict):
        return {k: _unpacked(v, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_unpacked(v, memo) for v in obj)
    return obj


def full_tensors(tree: dict, group=None) -> dict:
    """``tree`` (dicts of tensors, nested) with each DTensor replaced by its full tensor — what its ``full_tensor()``
    gives, bitwise — and every tensor by a CPU copy. One exchange, not a gather per tensor (one at a time, each a
    meeting of the ranks, they were 60 % of a 4-rank torch stack case on 2 cores): every rank sends its DTensors' local
    shards with their boxes (``__create_chunk_list__``, the protocol torch's distributed checkpoint reads), and each
    assembles its own from the ranks ``full_tensor()`` gathers from — its mesh's, at its coordinate on every
    replicated dimension. A DTensor whose boxes do not tile it exactly (or that has a partial placement, or a torch
    without the protocol) is gathered by its own ``full_tensor()``, on every rank of its mesh alike. Every rank of
    ``group`` (the world where None) calls it; the DTensors' meshes lie within it."""
    leaves = list(_leaves(tree, ()))
    boxed = {path: _box(t) for path, t in leaves if hasattr(t, "full_tensor")}
    out = {}
    if boxed and dist.is_initialized() and dist.get_world_size(group) > 1:
        parts = exchanged({path: box for path, box in boxed.items() if box is not None}, group)
        everyone = dict(zip(dist.get_process_group_ranks(group or dist.group.WORLD), parts, strict=True))
        for path, t in leaves:
            if boxed.get(path) is not None:
                out[path] = _assembled(t, path, everyone)
        failed = [None] * len(parts)  # a path one rank could not assemble is gathered the library's way by all
        dist.all_gather_object(failed, sorted(path for path in boxed if out.get(path) is None), group=group)
        redo = set().union(*failed)
        out = {path: value for path, value in out.items() if path not in redo}
    for path, t in leaves:
        if path not in out:
            out[path] = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()
    return _rebuilt(tree, (), out)


def on_their_devices(full: dict, tree: dict) -> dict:
    """``full`` (``full_tensors(tree)``: CPU copies) with each tensor moved to the device of ``tree``'s tensor of the
    same path — for a caller whose comparisons run where the state lives (an offloaded parameter stays on the host)."""
    return {k: on_their_devices(v, tree[k]) if isinstance(v, dict) else v.to(tree[k].device) for k, v in full.items()}


def _leaves(node, path):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path, node


def _rebuilt(node, path, out):
    if isinstance(node, dict):
        return {key: _rebuilt(value, (*path, key), out) for key, value in node.items()}
    return out[path]


def _box(t):
    """(offsets, sizes, local shard on the CPU) of a DTensor, or None where torch does not describe it as one box."""
    if any(p.is_partial() for p in t.placements) or not hasattr(t, "__create_chunk_list__"):
        return None
    try:
        chunks = t.__create_chunk_list__()
    except Exception:  # noqa: BLE001 - the library's own gather serves it
        return None
    if len(chunks) != 1:
        return None
    local = t.to_local().detach()
    if tuple(chunks[0].sizes) != tuple(local.shape):
        return None
    return tuple(chunks[0].offsets), tuple(chunks[0].sizes), local.cpu().clone()


def _assembled(t, path, everyone: dict):
    """The full tensor of DTensor ``t`` from the boxes (``everyone``: global rank -> its boxes) of the ranks its
    ``full_tensor()`` gathers from; None where they do not cover it exactly once."""
    import torch

    mesh = t.device_mesh
    ranks, mine = mesh.mesh, mesh.get_coordinate()
    index = tuple(mine[d] if p.is_replicate() else slice(None) for d, p in enumerate(t.placements))
    full = torch.empty(t.shape, dtype=t.dtype)
    hits = torch.zeros(t.shape, dtype=torch.int32)
    for rank in ranks[index].flatten().tolist():
        box = everyone.get(rank, {}).get(path)
        if box is None:
            return None
        offsets, sizes, local = box
        where = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
        full[where] = local
        hits[where] += 1
    return full if bool((hits == 1).all()) else None


def others_then_mine(everyone: list, me: int) -> list:
    """The ranks' parts in the order a boxes-writing adapter writes them: the others in rank order, its own last."""
    return everyone[:me] + everyone[me + 1:] + [everyone[me]]


def tied(params: dict, optimizer: dict) -> None:
    """A tied embedding, in place: one parameter (named once by the stack) under both names, its optimizer state
    once, under the embedding's name; where the tie broke (two parameters), each is reported as it is."""
    for a, b in (("embed.weight", "head.weight"), ("head.weight", "embed.weight")):
        if a not in params and b in params:
            params[a] = params[b]
    if "embed.weight" not in optimizer and "head.weight" in optimizer:
        optimizer["embed.weight"] = optimizer.pop("head.weight")
    elif params.get("embed.weight") is params.get("head.weight"):
        optimizer.pop("head.weight", None)
