"""DeepSpeed's Muon momentum at ZeRO 1 / 2, read where its ZeRO optimizer keeps it.

Its own reader, ``safe_get_full_optimizer_state(p, "momentum_buffer")``, raises there (DeepSpeed 0.19.8:
"momentum_buffer not found in optimizer state fragment", on some ranks and not others): the fragment mapping it
reads covers the flat fp32 partition, while Muon's momentum is another layout — ``_muon_momentum_buffer``: one flat
buffer per parameter group and rank, the **whole** tensors of ``params_in_partition[group]`` one after another
(Newton-Schulz needs whole matrices, so a tensor that straddles two partitions is whole on both ranks). ``momentum``
reads that layout where ``layout_of`` finds it on every rank (private: the guard); anywhere else (another release)
it falls back to DeepSpeed's own reader, whatever that does."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device

KEY = "momentum_buffer"


def layout_of(buffer: torch.Tensor | None, tensors: list) -> list | None:
    """[(tensor, its momentum: a view of ``buffer``)] where ``buffer`` holds exactly ``tensors`` whole, in order (the
    layout of DeepSpeed 0.19.8's ``_muon_momentum_buffer``); None where it does not."""
    sizes = [t.numel() for t in tensors]
    if buffer is None or buffer.dim() != 1 or buffer.numel() != sum(sizes):
        return None
    out, at = [], 0
    for t, n in zip(tensors, sizes, strict=True):
        out.append((t, buffer.narrow(0, at, n).view(t.shape)))
        at += n
    return out


def _held_here(optimizer, names: dict) -> dict | None:
    """{name: momentum} of each Muon tensor this rank's partitions hold whole; None where a Muon group's buffer is not
    in the layout ``layout_of`` reads (no collective: each rank decides for itself)."""
    out = {}
    for g, tensors in enumerate(getattr(optimizer, "params_in_partition", None) or []):
        if not tensors or not getattr(tensors[0], "use_muon", False):
            continue
        try:
            flat = optimizer.optimizer.param_groups[g]["params"][0]
            buffer = optimizer.optimizer.state.get(flat, {}).get(KEY)
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
        pairs = layout_of(buffer, tensors)
        if pairs is None:
            return None
        out.update({names[id(t)]: m.detach().float().clone() for t, m in pairs if id(t) in names})
    return out if hasattr(optimizer, "params_in_partition") else None


def momentum(optimizer, params: dict, group=None) -> dict:
    """{name: the full momentum} of each Muon parameter of ``params`` ({name: parameter}; those tagged ``use_muon``)
    under DeepSpeed's ZeRO 1 / 2 ``optimizer``, on every rank of ``group`` (its data-parallel group): each tensor from
    the lowest rank whose partition holds it whole, where every rank finds the layout and every tensor is held; else
    DeepSpeed's own ``safe_get_full_optimizer_state``."""
    from deepspeed.utils import safe_get_full_optimizer_state

    muon = {k: p for k, p in params.items() if getattr(p, "use_muon", False)}
    if not muon:  # no Muon (the same tags on every rank): nothing to read, no collective
        return {}
    mine = _held_here(optimizer, {id(p): k for k, p in muon.items()})
    found = torch.tensor([0 if mine is None else 1], device=rank_device())  # nccl's groups have no CPU backend
    dist.all_reduce(found, op=dist.ReduceOp.MIN, group=group)  # every rank reads the same way
    if found.item():
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
        out = {}
        for held in gathered:  # the lowest rank's copy (a straddling tensor's is the same computation on each)
            for k, m in held.items():
                out.setdefault(k, m)
        if set(out) == set(muon):
            return out
    return {k: safe_get_full_optimizer_state(p, KEY) for k, p in muon.items()}
