"""Activation memory measured from the tensors autograd saves for backward (saved-tensor hooks): each
storage counted once while any saved reference to it is alive; parameters left out (they are model
state, not activations). Peak over forward and backward — checkpointing's recomputation saves again
during backward, one segment at a time."""

from __future__ import annotations

import contextlib

import torch


class SavedTensorMeter:
    def __init__(self, exclude: list[torch.Tensor] = ()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, references]
        self.current = self.peak = 0

    def _pack(self, t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.exclude or t.untyped_storage().nbytes() == 0:
            return t
        return _Held(t, ptr, self)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def add(self, ptr: int, nbytes: int) -> None:
        entry = self.live.setdefault(ptr, [nbytes, 0])
        if entry[1] == 0:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[1] += 1

    def remove(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[ptr]

    @contextlib.contextmanager
    def measure(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


class _Held:
    def __init__(self, tensor, ptr, meter):
        self.tensor, self.ptr, self.meter = tensor, ptr, meter
        meter.add(ptr, tensor.untyped_storage().nbytes())

    def __del__(self):
        self.meter.remove(self.ptr)
