"""Data parallelism: every rank holds the whole model, runs its slice of the global batch, and the
gradients are averaged across the group before the optimizer step — so a step equals one device's step
on the whole batch (for a loss that is a mean over samples and equal slices).

Communication per step: one all-reduce of the Psi gradient elements, 2 (N - 1)/N Psi elements sent per
rank (ring). Memory per rank: Psi parameters + Psi gradients + K Psi optimizer state (no sharding).

- ``NaiveDataParallel``: after backward, all-reduce every gradient, one call per parameter.
- ``BucketedDataParallel``: gradients are copied into flat buckets as they become ready during backward
  (parameters in reverse order, the order backward produces them); a bucket's all-reduce is launched
  as soon as it is full, overlapping the rest of backward; ``finish`` waits for them. Afterwards each
  parameter's ``.grad`` is a view into its bucket (no second copy of the gradients).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn


class NaiveDataParallel(nn.Module):
    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        self.module, self.group = module, group

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None

    def finish(self) -> None:
        """Average every gradient over the group: call after backward, before the optimizer step."""
        n = dist.get_world_size(self.group)
        for p in self.module.parameters():
            if p.grad is not None:
                if n > 1:
                    dist.all_reduce(p.grad, group=self.group)
                p.grad /= n


class BucketedDataParallel(nn.Module):
    def __init__(self, module: nn.Module, group=None, bucket_bytes: int = 1 << 20):
        super().__init__()
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive; got {bucket_bytes}.")
        self.module, self.group = module, group
        params = [p for p in module.parameters() if p.requires_grad][::-1]  # backward's order
        self.buckets: list[list[nn.Parameter]] = []
        size = bucket_bytes + 1
        for p in params:
            if size + p.numel() * p.element_size() > bucket_bytes and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.flats = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                      for b in self.buckets]
        self._where = {id(p): (i, sum(q.numel() for q in b[:j])) for i, b in enumerate(self.buckets)
                       for j, p in enumerate(b)}
        self._pending = [len(b) for b in self.buckets]
        self._works: list = []
        self._sync = True
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate into ``.grad`` (gradient accumulation's first k - 1
        micro-steps); the next backward outside hands the accumulated gradients to the buckets."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _ready(self, p: nn.Parameter) -> None:
        if not self._sync:
            return
        i, offset = self._where[id(p)]
        self.flats[i][offset:offset + p.numel()].copy_(p.grad.flatten())
        p.grad = None  # the bucket holds it now
        self._pending[i] -= 1
        if self._pending[i] == 0 and dist.get_world_size(self.group) > 1:
            self._works.append(dist.all_reduce(self.flats[i], group=self.group, async_op=True))

    def finish(self) -> None:
        """Wait for every bucket's all-reduce, average, and point each ``.grad`` into its bucket."""
        if any(self._pending):
            missing = sum(self._pending)
            raise RuntimeError(f"{missing} parameter(s) received no gradient in this backward; every "
                               "parameter must take part (the buckets would never be reduced).")
        for work in self._works:
            work.wait()
        self._works = []
        n = dist.get_world_size(self.group)
        for bucket, flat in zip(self.buckets, self.flats, strict=True):
            flat /= n
            offset = 0
            for p in bucket:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self._pending = [len(b) for b in self.buckets]

    def zero_grad(self) -> None:
        for flat in self.flats:
            flat.zero_()
        for p in self.module.parameters():
            p.grad = None
