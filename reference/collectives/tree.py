"""Binomial-tree broadcast and reduce, and the tree all-reduce built from them.

Ranks are renumbered relative to the root, v = (r - root) mod N. In round k (mask = 2^k) every rank
v < mask that already holds the data sends it to v + mask: ceil(log2 N) rounds, N - 1 messages in all.
Reduce runs the same tree backwards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import Peers, check_op, combine, finish_avg, flat_view


def _check_root(root: int, n: int, name: str) -> None:
    if not 0 <= root < n:
        raise ValueError(f"{name} must be a rank of the group, 0..{n - 1}; got {root}.")


def tree_broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None = None) -> int:
    """Copy ``src``'s tensor to every rank along a binomial tree; returns the bytes this rank sent.

    Volume: rank v sends S once per child (v's children are v + 2^k for 2^k > v); over all ranks
    exactly (N - 1) * S. Latency: ceil(log2 N) rounds.
    """
    peers = Peers(group)
    n = peers.size
    _check_root(src, n, "src")
    flat = flat_view(tensor)
    v = (peers.rank - src) % n
    mask = 1
    while mask < n:
        if v < mask and v + mask < n:
            peers.send((v + mask + src) % n, flat)
        elif mask <= v < 2 * mask:
            peers.recv((v - mask + src) % n, flat)
        mask <<= 1
    return peers.bytes_sent


def tree_reduce(tensor: torch.Tensor, dst: int, op: str = "sum", group: dist.ProcessGroup | None = None) -> int:
    """Reduce every rank's tensor into ``dst``'s along a binomial tree; returns the bytes sent.

    Volume: every rank but ``dst`` sends S exactly once; (N - 1) * S in all. Only ``dst``'s tensor is
    written; the others are left unchanged (partial sums go to a scratch copy).
    """
    check_op(op, tensor.dtype)
    peers = Peers(group)
    n = peers.size
    _check_root(dst, n, "dst")
    flat = flat_view(tensor)
    v = (peers.rank - dst) % n
    acc, buf = flat, None
    mask = 1
    while mask < n:
        if v & mask:
            peers.send((v - mask + dst) % n, acc)
            break
        if v + mask < n:
            if buf is None:
                buf = torch.empty_like(flat)
                acc = flat if v == 0 else flat.clone()
            peers.recv((v + mask + dst) % n, buf)
            combine(acc, buf, op)
        mask <<= 1
    if v == 0:
        finish_avg(flat, op, n)
    return peers.bytes_sent


def tree_all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None) -> int:
    """All-reduce as a binomial-tree reduce to rank 0 then a binomial-tree broadcast from it.

    Volume: (N - 1) * S in each phase over all ranks; latency 2 ceil(log2 N) rounds, but the root's
    links carry log2 N full copies each way, so it is a latency algorithm, not a bandwidth one.
    """
    sent = tree_reduce(tensor, 0, op, group)
    return sent + tree_broadcast(tensor, 0, group)
