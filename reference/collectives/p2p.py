"""Point-to-point plumbing shared by the reference collectives: peers, chunking, reduction, bytes.

Every reference algorithm is built only on ``isend``/``irecv`` (through ``batch_isend_irecv``) within
an explicitly passed process group, and counts the bytes its rank sends, so a property can hold the
count to the formula in the algorithm's docstring.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import Unsupported

REDUCE_OPS = ("sum", "avg", "max", "min", "product")
__all__ = ["REDUCE_OPS", "Unsupported"]


def check_op(op: str, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` for an unknown op, ``Unsupported`` for AVG on a non-floating dtype."""
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {', '.join(REDUCE_OPS)}; got {op!r}.")
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise Unsupported(f"AVG is defined for floating dtypes only, not {dtype}.")


def combine(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """acc <- acc (op) other, elementwise and in place; AVG accumulates a sum (divided at the end)."""
    if op in ("sum", "avg"):
        acc.add_(other)
    elif op == "max":
        torch.maximum(acc, other, out=acc)
    elif op == "min":
        torch.minimum(acc, other, out=acc)
    elif op == "product":
        acc.mul_(other)
    else:
        raise ValueError(f"op must be one of {', '.join(REDUCE_OPS)}; got {op!r}.")


def finish_avg(tensor: torch.Tensor, op: str, n: int) -> None:
    """For AVG, divide the accumulated sum by the group size (one rounding, as in nccl)."""
    if op == "avg" and tensor.numel():
        tensor.div_(n)


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ranges whose sizes differ by at most one.

    The first ``numel % parts`` ranges get one extra element; ranges may be empty (numel < parts).
    """
    base, extra = divmod(numel, parts)
    bounds, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class Peers:
    """This rank's view of ``group``: its rank, the size, and byte-counted send/recv to group ranks."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.bytes_sent = 0
        # nccl runs a pair's point-to-point ops in order on one stream: a send posted before the
        # matching receive can deadlock unless both are grouped (``exchange``). gloo's are independent.
        self.streamed = dist.get_backend(group) != "nccl"

    def exchange(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]):
        """Post every send and receive at once, then wait for all; empty tensors are not sent.

        Both sides derive the same sizes from the same chunking, so they agree on what is skipped.
        """
        ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=p) for p, t in sends if t.numel()]
        ops += [dist.P2POp(dist.irecv, t, group=self.group, group_peer=p) for p, t in recvs if t.numel()]
        self.bytes_sent += sum(t.numel() * t.element_size() for _, t in sends)
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def isend(self, peer: int, tensor: torch.Tensor):
        """Post a send (counted); returns its work handle, or None for an empty tensor."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, group=self.group, group_dst=peer) if tensor.numel() else None

    def irecv(self, peer: int, tensor: torch.Tensor):
        """Post a receive; returns its work handle, or None for an empty tensor."""
        return dist.irecv(tensor, group=self.group, group_src=peer) if tensor.numel() else None

    def send(self, peer: int, tensor: torch.Tensor) -> None:
        self.exchange([(peer, tensor)], [])

    def recv(self, peer: int, tensor: torch.Tensor) -> None:
        self.exchange([], [(peer, tensor)])


def check_blocks(what: str, whole: torch.Tensor, block: torch.Tensor, n: int) -> None:
    """``whole`` must hold exactly ``n`` blocks the size of ``block`` (both flat)."""
    if whole.numel() != n * block.numel():
        raise ValueError(f"{what}: the larger tensor must hold group size * the smaller one's elements; "
                         f"{whole.numel()} != {n} * {block.numel()}.")


def wait_all(works) -> None:
    for work in works:
        if work is not None:
            work.wait()


def flat_view(tensor: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """The tensor as a 1-D view sharing its storage; non-contiguous input is a caller error."""
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()}).")
    return tensor.view(-1)
