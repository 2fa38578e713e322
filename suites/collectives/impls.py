"""Implementations the suites load by ``package.module:object`` spec, exactly as a user's own would be.

``ring_small_pieces`` exercises the ring's pipelining on small tensors. The others plant one classic
bug each in the reference, to show the properties catch it and shrink it to its minimal case.
"""

from __future__ import annotations

import torch.distributed as dist

from reference.collectives import ReferenceCollectives


def ring_small_pieces():
    """The reference ring with 12-byte pieces: many pieces per chunk, even for tiny tensors."""
    return ReferenceCollectives("ring", piece_bytes=12)


def ring_unpipelined():
    """The reference ring with one grouped send + receive per step: the path nccl takes."""
    return ReferenceCollectives("ring", piece_bytes=0)


class DropsRemainder(ReferenceCollectives):
    """Planted bug: all-reduces only the first numel - numel % N elements (a dropped remainder chunk)."""

    def all_reduce(self, tensor, op="sum", group=None):
        flat = tensor.view(-1)
        super().all_reduce(flat[: flat.numel() - flat.numel() % dist.get_world_size(group)], op, group)


class ForgetsAverage(ReferenceCollectives):
    """Planted bug: AVG returns the sum (a missing division by the group size). One bug only: AVG on an integer dtype is
    still refused as the reference refuses it (else its minimal failure would be that acceptance at one rank, and which
    of the two hypothesis' shrinker reaches first differs between its releases)."""

    def all_reduce(self, tensor, op="sum", group=None):
        super().all_reduce(tensor, "sum" if op == "avg" and tensor.dtype.is_floating_point else op, group)


class IgnoresSrc(ReferenceCollectives):
    """Planted bug: broadcast always from rank 0."""

    def broadcast(self, tensor, src, group=None):
        super().broadcast(tensor, 0, group)


class AcceptsIntegerAvg(ReferenceCollectives):
    """Accepts AVG on integer dtypes as NCCL does (sum, then integer division): outside the contract."""

    def all_reduce(self, tensor, op="sum", group=None):
        if op == "avg" and not tensor.dtype.is_floating_point:
            super().all_reduce(tensor, "sum", group)
            tensor.div_(dist.get_world_size(group), rounding_mode="trunc")
            return
        super().all_reduce(tensor, op, group)


class RaisesOnRankOne(ReferenceCollectives):
    """Planted bug: raises a plain error (not Unsupported) on rank 1; the other ranks return zeros."""

    def all_gather(self, output, input, group=None):
        if dist.get_rank(group) == 1:
            raise RuntimeError("out of buffers")
        output.zero_()


_FIRST: dict[int, object] = {}


class RhdLeavesOutExtraRanks(ReferenceCollectives):
    """Planted bug: recursive halving/doubling over the largest power of two P only; the ranks beyond it
    (world size 3: rank 2) keep their own input. Invisible at world sizes 1, 2, 4, 8."""

    def __init__(self):
        super().__init__("rhd")

    def all_reduce(self, tensor, op="sum", group=None):
        n = dist.get_world_size(group)
        p2 = 1 << (n.bit_length() - 1)
        if group is not None or n == p2:
            return super().all_reduce(tensor, op, group)
        if p2 not in _FIRST:  # every rank makes the same call, so every rank creates the group
            _FIRST[p2] = dist.new_group(list(range(p2)))
        if dist.get_rank() < p2:
            super().all_reduce(tensor, op, _FIRST[p2])


class LastRankRaisesOnOddLength(ReferenceCollectives):
    """Planted: a shape check that fires only where the uneven remainder lives — the last rank raises on an
    odd length while its peers enter the all-reduce and block there."""

    def all_reduce(self, tensor, op="sum", group=None):
        if dist.get_rank(group) == dist.get_world_size(group) - 1 and tensor.numel() % 2:
            raise ValueError(f"odd length {tensor.numel()} not supported on the last rank")
        super().all_reduce(tensor, op, group)


def _blocks(t, n: int):
    """``t`` flat as n equal blocks, one row each."""
    return t.reshape(n, -1)


class ReduceScatterNextBlock(ReferenceCollectives):
    """Planted bug: a ring's chunk index one off — rank r gets the reduced block r + 1 (mod n), not block r."""

    def reduce_scatter(self, output, input, op="sum", group=None):
        n = dist.get_world_size(group)
        super().reduce_scatter(output, _blocks(input, n).roll(-1, 0).reshape(input.shape), op, group)


class AllToAllBlocksByOffset(ReferenceCollectives):
    """Planted bug: all-to-all's received blocks stored by their ring offset, not by their sender — rank r writes
    rank j's block at (j - r) mod n (rank 0's output right, every other rank's rotated)."""

    def all_to_all(self, output, input, group=None):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        received = output.clone()
        super().all_to_all(received, input, group)
        _blocks(output, n).copy_(_blocks(received, n).roll(-r, 0))
