"""Pairwise-exchange all-to-all: in step s, rank r sends to r + s and receives from r - s."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import Peers, flat_view


def pairwise_all_to_all(output: torch.Tensor, input: torch.Tensor,
                        group: dist.ProcessGroup | None = None) -> int:
    """Block j of rank r's ``input`` lands as block r of rank j's ``output``; returns bytes sent.

    Both flat tensors are cut into N equal blocks. Volume per rank: (N - 1)/N * S (its own block is a
    local copy), in N - 1 steps where every rank sends and receives exactly one block. ``output`` may
    be ``input`` itself (the input is then copied first).
    """
    peers = Peers(group)
    n, r = peers.size, peers.rank
    flat_in, flat_out = flat_view(input, "input"), flat_view(output, "output")
    if flat_in.numel() != flat_out.numel() or flat_in.numel() % n:
        raise ValueError(
            f"all_to_all needs input and output of equal numel divisible by the group size {n}; "
            f"got {flat_in.numel()} and {flat_out.numel()}.")
    if flat_in.numel() and flat_in.data_ptr() == flat_out.data_ptr():
        flat_in = flat_in.clone()
    block = flat_in.numel() // n

    def blk(t: torch.Tensor, j: int) -> torch.Tensor:
        return t[j * block:(j + 1) * block]

    blk(flat_out, r).copy_(blk(flat_in, r))
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        peers.exchange([(to, blk(flat_in, to))], [(frm, blk(flat_out, frm))])
    return peers.bytes_sent
