"""A collectives implementation to copy from: every collective built on ``torch.distributed.all_gather``
and local arithmetic. Slow (every rank receives everything), simple to
read, and conformant: run it through the suite with

    pytest suites/collectives --impl docs.examples.gather_collectives:GatherCollectives
    paritybench bench collectives --impl docs.examples.gather_collectives:GatherCollectives --world-sizes 2

What it cannot do it says so with ``Unsupported`` (reported as unsupported, never as a pass): here the
PRODUCT reduction, to show how.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.contracts import Unsupported


def _everyone(tensor: torch.Tensor, group) -> torch.Tensor:
    """(n, numel): every rank's flat tensor, in group rank order."""
    flat = tensor.contiguous().reshape(-1)
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, flat, group=group)
    return torch.stack(parts)


def _reduce(stacked: torch.Tensor, op: str) -> torch.Tensor:
    if op == "sum":
        return stacked.sum(0, dtype=stacked.dtype)
    if op == "avg":
        if not stacked.dtype.is_floating_point:
            raise Unsupported(f"AVG is defined for floating dtypes only, not {stacked.dtype}.")
        # sum in the tensor's own dtype, then one division: the contract allows 1 ulp of the exact quotient
        return stacked.sum(0, dtype=stacked.dtype) / stacked.shape[0]
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    raise Unsupported(f"reduction {op!r} is not provided by this example (sum, avg, max, min are).")


class GatherCollectives:
    """The collectives contract (harness/contracts/collectives.py) over all_gather."""

    def all_reduce(self, tensor, op="sum", group=None) -> None:
        tensor.copy_(_reduce(_everyone(tensor, group), op).view_as(tensor))

    def reduce_scatter(self, output, input, op="sum", group=None) -> None:
        r, c = dist.get_rank(group), output.numel()
        reduced = _reduce(_everyone(input, group), op)
        output.copy_(reduced[r * c:(r + 1) * c].view_as(output))  # safe in place: reduced is a new tensor

    def all_gather(self, output, input, group=None) -> None:
        output.copy_(_everyone(input, group).reshape(-1).view_as(output))

    def broadcast(self, tensor, src, group=None) -> None:
        tensor.copy_(_everyone(tensor, group)[src].view_as(tensor))

    def reduce(self, tensor, dst, op="sum", group=None) -> None:
        reduced = _reduce(_everyone(tensor, group), op)
        if dist.get_rank(group) == dst:
            tensor.copy_(reduced.view_as(tensor))

    def all_to_all(self, output, input, group=None) -> None:
        n, r = dist.get_world_size(group), dist.get_rank(group)
        c = input.numel() // n
        everyone = _everyone(input, group)  # row j: rank j's input; I take block r of each
        output.copy_(everyone[:, r * c:(r + 1) * c].reshape(-1).view_as(output))
