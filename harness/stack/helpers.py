"""Helpers for a stack adapter (public): what the contract asks that a library does not hand back as asked."""

from __future__ import annotations

import torch.distributed as dist


def from_rank0(state: dict | None, group=None) -> dict:
    """The state ``dense_state`` returns, on every rank of ``group``, from a library that builds it on the group's
    first rank only (accelerate's ``get_state_dict``; ``get_model_state_dict`` with ``full_state_dict`` and
    ``cpu_offload``): pass what this rank got (None, or an empty dict, off rank 0) — rank 0's is broadcast
    (tensors on the CPU) and returned everywhere. A collective: call it on every rank."""
    box = [state if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    if box[0] is None:
        raise ValueError("from_rank0: the group's first rank passed no state.")
    return box[0]
