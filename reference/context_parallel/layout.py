"""Sequence layouts of context parallelism: which tokens of the sequence each of the cp ranks holds.

- ``contiguous``: rank r holds tokens [r s / cp, (r + 1) s / cp). Under a causal mask the last rank
  attends to the whole sequence and the first to its own chunk only: cp times more work on the last.
- ``zigzag`` (load-balanced, the "head-tail" split of Megatron's and torch's context parallelism): the
  sequence cut into 2 cp chunks, rank r holds chunks r and 2 cp - 1 - r — every rank an early and a late
  chunk, the same causal work on each.

A rank's tokens are kept in the order of its chunks; ``positions`` gives each one's global position (for
the rotary embedding and the causal mask), so nothing downstream needs the tokens in global order.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def check(seq: int, cp: int, layout: str) -> None:
    """One sentence for a sequence the layout cannot split evenly (never a rank silently short)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
    parts = cp if layout == "contiguous" else 2 * cp
    if seq % parts:
        raise ValueError(f"a sequence of {seq} tokens does not split into the {parts} equal chunks the {layout} "
                         f"layout over cp = {cp} needs; pad it to a multiple of {parts}.")


def chunks(seq: int, cp: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """[(start, end)] of the global positions rank ``rank`` holds, in its order."""
    check(seq, cp, layout)
    if layout == "contiguous":
        n = seq // cp
        return [(rank * n, (rank + 1) * n)]
    n = seq // (2 * cp)
    return [(rank * n, (rank + 1) * n), ((2 * cp - 1 - rank) * n, (2 * cp - rank) * n)]


def positions(seq: int, cp: int, rank: int, layout: str, device=None) -> torch.Tensor:
    """The global positions of rank ``rank``'s tokens, in its order."""
    return torch.cat([torch.arange(a, b, device=device) for a, b in chunks(seq, cp, rank, layout)])


def shard(x: torch.Tensor, cp: int, rank: int, layout: str, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s tokens of ``x`` along ``dim`` (a copy)."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in chunks(x.shape[dim], cp, rank, layout)], dim=dim).clone()


def unshard(parts: list[torch.Tensor], layout: str, dim: int = 1) -> torch.Tensor:
    """Every rank's shard (in rank order) back into the whole sequence."""
    cp = len(parts)
    seq = sum(p.shape[dim] for p in parts)
    out = torch.empty_like(parts[0]).narrow(dim, 0, 1).expand(
        *[seq if i == dim % parts[0].dim() else n for i, n in enumerate(parts[0].shape)]).contiguous()
    for rank, part in enumerate(parts):
        offset = 0
        for a, b in chunks(seq, cp, rank, layout):
            out.narrow(dim, a, b - a).copy_(part.narrow(dim, offset, b - a))
            offset += b - a
    return out
