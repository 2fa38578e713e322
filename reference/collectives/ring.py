"""Ring collectives: reduce-scatter, all-gather, and all-reduce = reduce-scatter + all-gather.

The flat tensor of S bytes is cut into N chunks (sizes differ by at most one element). In each of
N - 1 steps every rank sends one chunk to its right neighbour and receives one from its left, so
every link carries the same load and no rank is a hot spot (Patarasuk & Yuan 2009; nccl's ring).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import Peers, check_blocks, check_op, chunk_bounds, combine, finish_avg, flat_view, wait_all

# Chunks move in pieces: a received piece is reduced while the next one is still arriving, and is
# forwarded as soon as it is reduced (the pipelining gloo and nccl use). Each piece costs a Python-level
# send/recv, so pieces are large: half a chunk, within [1 MiB, 4 MiB] (measured best on gloo/CPU at
# 16-64 MiB, 2 and 4 ranks; see the closing note of the foundation issue).
# piece_bytes=0 turns pipelining off: one grouped send + receive per step, as on nccl.
PIECE_MIN_BYTES, PIECE_MAX_BYTES = 1 << 20, 4 << 20


def _pieces(lo: int, hi: int, piece_elems: int) -> list[tuple[int, int]]:
    return [(a, min(a + piece_elems, hi)) for a in range(lo, hi, piece_elems)]


def _piece_elems(bounds, elem: int, piece_bytes: int | None) -> int:
    """Elements per piece: ``piece_bytes`` if given, else half the largest chunk within the limits."""
    if piece_bytes is None:
        half_chunk = max(hi - lo for lo, hi in bounds) * elem // 2
        piece_bytes = min(PIECE_MAX_BYTES, max(PIECE_MIN_BYTES, half_chunk))
    return max(1, piece_bytes // elem)


def _ring_reduce_scatter_flat(peers: Peers, flat: torch.Tensor, bounds, op: str,
                              piece_bytes: int | None = None) -> int:
    """Reduce ``flat`` in place so that chunk (rank + 1) % N holds the full reduction; return its index.

    Step s: send chunk (r - s) mod N to the right, receive chunk (r - s - 1) mod N from the left and
    combine it into the local copy; after N - 1 steps chunk (r + 1) mod N has seen every rank. Each
    received piece is combined while the next is in flight, then forwarded at once: it is part of the
    chunk the next step sends.
    """
    n, r = peers.size, peers.rank
    right, left = (r + 1) % n, (r - 1) % n
    if piece_bytes == 0 or not peers.streamed:
        return _ring_reduce_scatter_grouped(peers, flat, bounds, op)
    piece = _piece_elems(bounds, flat.element_size(), piece_bytes)
    sends = [peers.isend(right, flat[a:b]) for a, b in _pieces(*bounds[r], piece)]
    # Everything this rank receives, in arrival order: step s brings chunk (r - s - 1) mod N.
    stream = [(s, a, b) for s in range(n - 1) for a, b in _pieces(*bounds[(r - s - 1) % n], piece)]
    piece = min(piece, max((b - a for _, a, b in stream), default=0))
    bufs = [torch.empty(piece, dtype=flat.dtype, device=flat.device) for _ in range(2)]
    recvs = [peers.irecv(left, bufs[j][: b - a]) for j, (_, a, b) in enumerate(stream[:2])]
    for j, (s, a, b) in enumerate(stream):
        recvs[j].wait()
        combine(flat[a:b], bufs[j % 2][: b - a], op)
        if j + 2 < len(stream):  # buffer j % 2 is free again: receive ahead, across step boundaries
            _, a2, b2 = stream[j + 2]
            recvs.append(peers.irecv(left, bufs[j % 2][: b2 - a2]))
        if s < n - 2:
            sends.append(peers.isend(right, flat[a:b]))
    wait_all(sends)
    return (r + 1) % n


def _ring_reduce_scatter_grouped(peers: Peers, flat: torch.Tensor, bounds, op: str) -> int:
    """The same ring, one grouped send + receive per step: nccl's path (its kernels pipeline by
    themselves), or any backend's with piece_bytes=0."""
    n, r = peers.size, peers.rank
    buf = torch.empty(max(hi - lo for lo, hi in bounds), dtype=flat.dtype, device=flat.device)
    for s in range(n - 1):
        send, (lo, hi) = bounds[(r - s) % n], bounds[(r - s - 1) % n]
        peers.exchange([((r + 1) % n, flat[slice(*send)])], [((r - 1) % n, buf[: hi - lo])])
        combine(flat[lo:hi], buf[: hi - lo], op)
    return (r + 1) % n


def _ring_all_gather_flat(peers: Peers, flat: torch.Tensor, bounds, owned: int,
                          piece_bytes: int | None = None) -> None:
    """Circulate chunks so that every rank ends with all of them; this rank starts owning ``owned``.

    Step s: send chunk (owned - s) mod N right, receive chunk (owned - s - 1) mod N from the left
    straight into its place (no copies); each received piece is forwarded as soon as it lands.
    """
    n = peers.size
    right, left = (peers.rank + 1) % n, (peers.rank - 1) % n
    if piece_bytes == 0 or not peers.streamed:  # one grouped send + receive per step
        for s in range(n - 1):
            send, recv = bounds[(owned - s) % n], bounds[(owned - s - 1) % n]
            peers.exchange([(right, flat[slice(*send)])], [(left, flat[slice(*recv)])])
        return
    piece = _piece_elems(bounds, flat.element_size(), piece_bytes)
    sends = [peers.isend(right, flat[a:b]) for a, b in _pieces(*bounds[owned], piece)]
    # Every receive lands in its own place, so all of them are posted up front, in arrival order.
    stream = [(s, a, b) for s in range(n - 1) for a, b in _pieces(*bounds[(owned - s - 1) % n], piece)]
    recvs = [peers.irecv(left, flat[a:b]) for _, a, b in stream]
    for (s, a, b), work in zip(stream, recvs, strict=True):
        work.wait()
        if s < n - 2:
            sends.append(peers.isend(right, flat[a:b]))
    wait_all(sends)


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group: dist.ProcessGroup | None = None,
                    piece_bytes: int | None = None) -> int:
    """In-place all-reduce by ring reduce-scatter then ring all-gather; returns bytes this rank sent.

    Volume per rank: 2(N - 1) chunks of ceil or floor(numel / N) elements, i.e. 2(N - 1)/N * S up to
    chunk rounding; summed over ranks exactly 2(N - 1) * S. Works for any numel (0, 1, < N, primes).
    """
    check_op(op, tensor.dtype)
    peers = Peers(group)
    flat = flat_view(tensor)
    if peers.size > 1 and flat.numel():
        bounds = chunk_bounds(flat.numel(), peers.size)
        owned = _ring_reduce_scatter_flat(peers, flat, bounds, op, piece_bytes)
        finish_avg(flat[slice(*bounds[owned])], op, peers.size)
        _ring_all_gather_flat(peers, flat, bounds, owned, piece_bytes)
    return peers.bytes_sent


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                        group: dist.ProcessGroup | None = None, piece_bytes: int | None = None) -> int:
    """output <- rank r's block of the reduction of ``input`` (N equal blocks); returns bytes sent.

    Volume per rank: (N - 1) blocks = (N - 1)/N * S with S the whole input. ``input`` is left unchanged
    (it is reduced in a scratch copy). The ring is rotated so that rank r finishes owning block r.
    """
    check_op(op, input.dtype)
    peers = Peers(group)
    n = peers.size
    flat_in, flat_out = flat_view(input, "input"), flat_view(output, "output")
    check_blocks("reduce_scatter", flat_in, flat_out, n)
    block = flat_out.numel()
    if n == 1 or block == 0:
        flat_out.copy_(flat_in)
        finish_avg(flat_out, op, n)
        return 0
    # The ring leaves chunk (r + 1) % N at rank r; naming block c - 1 "chunk c" makes that block r.
    work = flat_in.clone()
    bounds = [(((c - 1) % n) * block, ((c - 1) % n + 1) * block) for c in range(n)]
    owned = _ring_reduce_scatter_flat(peers, work, bounds, op, piece_bytes)
    flat_out.copy_(work[slice(*bounds[owned])])
    finish_avg(flat_out, op, n)
    return peers.bytes_sent


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None,
                    piece_bytes: int | None = None) -> int:
    """output <- concatenation of every rank's ``input`` in rank order; returns bytes sent.

    Volume per rank: (N - 1) * input bytes = (N - 1)/N * S with S the whole output. In place when
    ``input`` is rank r's slice of ``output`` (nccl-tests' definition); the copy is then skipped.
    """
    peers = Peers(group)
    n = peers.size
    flat_in, flat_out = flat_view(input, "input"), flat_view(output, "output")
    check_blocks("all_gather", flat_out, flat_in, n)
    block = flat_in.numel()
    mine = flat_out[peers.rank * block:(peers.rank + 1) * block]
    if block and mine.data_ptr() != flat_in.data_ptr():
        mine.copy_(flat_in)
    if n > 1 and block:
        bounds = [(c * block, (c + 1) * block) for c in range(n)]
        _ring_all_gather_flat(peers, flat_out, bounds, peers.rank, piece_bytes)
    return peers.bytes_sent
