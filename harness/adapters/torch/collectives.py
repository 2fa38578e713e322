"""The ``torch`` implementation: native ``torch.distributed`` collectives, as the backend runs them.

Nothing is emulated here: where the backend rejects an operation, the rejection is reported as
``Unsupported`` with the backend's reason.
"""

from __future__ import annotations

import torch.distributed as dist

from harness.contracts import Unsupported

_OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}
# Newer torch renames these (the old names warn); use whichever this torch has.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _reduce_op(op: str, dtype):
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(_OPS)}; got {op!r}.")
    if op == "avg":
        if not dtype.is_floating_point:
            # gloo: "result type Float can't be cast to the desired output type"; nccl: no integer AVG.
            raise Unsupported(f"torch.distributed AVG is not defined for {dtype} ({dist.get_backend()}).")
        if not hasattr(dist.ReduceOp, "AVG"):
            raise Unsupported("this torch has no ReduceOp.AVG.")
    return getattr(dist.ReduceOp, _OPS[op])


class TorchCollectives:
    """``torch.distributed``'s own collectives on the current backend (gloo, nccl, ...)."""

    def all_reduce(self, tensor, op="sum", group=None):
        dist.all_reduce(tensor, op=_reduce_op(op, tensor.dtype), group=group)

    def reduce_scatter(self, output, input, op="sum", group=None):
        _reduce_scatter(output.view(-1), input.view(-1), op=_reduce_op(op, input.dtype), group=group)

    def all_gather(self, output, input, group=None):
        _all_gather(output.view(-1), input.view(-1), group=group)

    def broadcast(self, tensor, src, group=None):
        dist.broadcast(tensor, group=group, group_src=src)

    def reduce(self, tensor, dst, op="sum", group=None):
        dist.reduce(tensor, group=group, group_dst=dst, op=_reduce_op(op, tensor.dtype))

    def all_to_all(self, output, input, group=None):
        if output.numel() and output.data_ptr() == input.data_ptr():
            # Found by this suite: with output aliasing input, gloo's all_to_all_single returns other
            # ranks' blocks in the wrong places (torch 2.13); suites/collectives/test_findings.py keeps
            # the raw behaviour under watch.
            raise Unsupported("torch.distributed.all_to_all_single does not support output aliasing input "
                              "(it returns wrong data instead of an error).")
        dist.all_to_all_single(output.view(-1), input.view(-1), group=group)
