"""How a stack adapter assembles its dense state (one device's names, every rank): the one precedence rule.

A rank reports what it holds as it holds it; what it does not hold it takes from the other ranks, the lowest
rank's copy first. So every copy of a replicated tensor is held to one device by the rank that holds it (a
replica that drifted fails on its own rank), and no rank's view hides another's. ``gathered`` applies the rule to
whole entries (a name -> its tensor, or its optimizer state); an adapter whose ranks hold boxes of one tensor
(the reference, Megatron) writes the other ranks' boxes first, in rank order, and its own last — the same rule.
``tied`` is the tied embedding's: one parameter under both names, its state once.
"""

from __future__ import annotations

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
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=group)
    return merged(everyone, dist.get_rank(group))


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
