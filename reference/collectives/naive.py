"""The naive central all-reduce: everyone sends to a root, the root reduces and sends back.

It is the baseline the ring improves on: the root's link carries (N - 1) * S each way, so its time
grows linearly in N while the ring's stays ~2S/bandwidth.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import Peers, check_op, combine, finish_avg, flat_view


def naive_all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None,
                     root: int = 0) -> int:
    """In-place all-reduce through a central root; returns the bytes this rank sent.

    Volume: every non-root rank sends S; the root sends (N - 1) * S. Over all ranks 2(N - 1) * S, like
    the ring, but all of it through one rank.
    """
    check_op(op, tensor.dtype)
    peers = Peers(group)
    n = peers.size
    flat = flat_view(tensor)
    if n == 1:
        finish_avg(flat, op, 1)
        return 0
    others = [p for p in range(n) if p != root]
    if peers.rank == root:
        bufs = [torch.empty_like(flat) for _ in others]
        peers.exchange([], list(zip(others, bufs, strict=True)))
        for buf in bufs:  # fixed order: the same bits on every run
            combine(flat, buf, op)
        finish_avg(flat, op, n)
        peers.exchange([(p, flat) for p in others], [])
    else:
        peers.send(root, flat)
        peers.recv(root, flat)
    return peers.bytes_sent
