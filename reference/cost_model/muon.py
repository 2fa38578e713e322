"""Bytes a rank sends for one step of the reference sharded Muon (``reference.muon.ShardedMuon``): per Muon matrix,
one all-gather of its update's parts, each padded to the longest part (``reference.muon.sharded.owned``); AdamW's
parameters step elementwise on their parts and send nothing. Replicated: nothing (every rank holds the whole)."""

from __future__ import annotations

from ._checks import choice, whole
from .communication import collective_bytes


def muon_step_bytes(parts: dict, layout: str, n: int, element_bytes: int = 4) -> float:
    """``parts``: each Muon matrix's part lengths per rank (elements; ``owned``'s index lengths). Each all-gather moves
    n times the longest part (nccl-tests' S of an all-gather: the gathered output), of which a rank sends (n-1)/n."""
    choice("layout", layout, ("replicated", "rows", "cols", "flat"))
    whole("n", n)
    if layout == "replicated" or n == 1:
        return 0.0
    return sum(collective_bytes("all_gather", n, n * max(lengths) * element_bytes) for lengths in parts.values())
