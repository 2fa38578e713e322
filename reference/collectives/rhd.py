"""Recursive halving (reduce-scatter) + recursive doubling (all-gather) all-reduce, for any N.

Rabenseifner's algorithm (Thakur, Rabenseifner & Gropp 2005). With P = 2^floor(log2 N) and
E = N - P extra ranks, the first 2E ranks pair up: each even one folds its whole vector into its odd
neighbour and sits out; the P remaining ranks halve the vector log2 P times (keeping one half, sending
the other to the partner at distance d = P/2, P/4, ..., 1), each ending with 1/P of the reduction,
then double back; finally the odd ranks hand the result to the ranks that sat out.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import Peers, check_op, chunk_bounds, combine, finish_avg, flat_view


def rhd_all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None) -> int:
    """In-place all-reduce by recursive halving/doubling; returns the bytes this rank sent.

    Volume per rank for N = P a power of two: 2(P - 1)/P * S up to block rounding, in 2 log2 P steps.
    Otherwise, additionally: an even rank r < 2E sends S once (fold); an odd rank r < 2E sends S once
    more (unfold) on top of its 2(P - 1)/P * S; an even one sends nothing else.
    """
    check_op(op, tensor.dtype)
    peers = Peers(group)
    n, r = peers.size, peers.rank
    flat = flat_view(tensor)
    if n == 1 or flat.numel() == 0:
        return 0
    p2 = 1 << (n.bit_length() - 1)
    extra = n - p2
    folded = r < 2 * extra and r % 2 == 0
    if r < 2 * extra:
        if folded:
            peers.send(r + 1, flat)
        else:
            buf = torch.empty_like(flat)
            peers.recv(r - 1, buf)
            combine(flat, buf, op)
    if not folded:
        _halve_and_double(peers, flat, op, vrank=r // 2 if r < 2 * extra else r - extra, p2=p2, extra=extra)
    if r < 2 * extra:
        if folded:
            peers.recv(r + 1, flat)
        else:
            peers.send(r - 1, flat)
    return peers.bytes_sent


def _halve_and_double(peers: Peers, flat: torch.Tensor, op: str, vrank: int, p2: int, extra: int) -> None:
    """Among the P = p2 participating ranks (virtual ranks 0..P-1): reduce-scatter, then all-gather."""

    def real(v: int) -> int:
        return 2 * v + 1 if v < extra else v + extra

    bounds = chunk_bounds(flat.numel(), p2)

    def span(blocks: tuple[int, int]) -> slice:
        return slice(bounds[blocks[0]][0], bounds[blocks[1] - 1][1])

    scratch = torch.empty(bounds[p2 // 2][0] if p2 > 1 else 0, dtype=flat.dtype, device=flat.device)
    steps, lo, hi, d = [], 0, p2, p2 // 2
    while d >= 1:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if vrank & d else ((lo, mid), (mid, hi))
        mine = flat[span(keep)]
        buf = scratch[: mine.numel()]
        peers.exchange([(real(vrank ^ d), flat[span(give)])], [(real(vrank ^ d), buf)])
        combine(mine, buf, op)
        steps.append((real(vrank ^ d), keep, give))
        lo, hi = keep
        d //= 2
    finish_avg(flat[span((lo, hi))], op, peers.size)
    for partner, keep, give in reversed(steps):
        peers.exchange([(partner, flat[span(keep)])], [(partner, flat[span(give)])])
