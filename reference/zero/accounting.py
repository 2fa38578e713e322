"""Bytes a rank holds, measured from the tensors themselves: each distinct storage counted once, at its
current size (a freed ZeRO-3 buffer has been resized to 0 bytes)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def held_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The per-element state tensors of ``optimizer`` (0-d ones such as Adam's ``step`` left out)."""
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0]
