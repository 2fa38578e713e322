"""The flat parameter buffer ZeRO shards: parameters laid end to end in one 1-D tensor, padded with zeros
to a multiple of the group size N, each parameter's ``.data`` a view into it; rank r owns the elements
[r S, (r + 1) S) with S = ceil(numel / N). A shard boundary may fall inside a parameter: the shard is a
range of the flat buffer, not a set of parameters (as DeepSpeed's stage 1/2 partitions).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _all_gather(out, inp, group):
    """all_gather_single where torch has it (all_gather_into_tensor is deprecated there)."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, group=group)


def _reduce_scatter(out, inp, group):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, group=group)


class FlatParams:
    """The parameters as one flat buffer, sharded over ``group``; ``replicate``: hybrid sharding's other group — the
    ranks holding the same shard in the other replicas, across which each reduced shard is all-reduced too."""

    def __init__(self, params: list[nn.Parameter], group=None, replicate=None):
        if not params:
            raise ValueError("FlatParams needs at least one parameter.")
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError(f"the parameters of one flat buffer must share a dtype; got {sorted(map(str, dtypes))}.")
        self.params, self.group, self.replicate = params, group, replicate
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.replicas = dist.get_world_size(replicate) if replicate is not None else 1
        self.numel = sum(p.numel() for p in params)
        self.shard_size = -(-self.numel // self.n)
        self.padded = self.shard_size * self.n
        self.buffer = torch.zeros(self.padded, dtype=params[0].dtype, device=params[0].device)
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            self.buffer[offset:offset + p.numel()].copy_(p.data.flatten())
            p.data = self.buffer[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    @property
    def shard(self) -> slice:
        """This rank's range of the flat buffer."""
        return slice(self.rank * self.shard_size, (self.rank + 1) * self.shard_size)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view into ``flat`` (a tensor laid out like the buffer)."""
        return [flat[o:o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets, strict=True)]

    def decaying(self, spec) -> torch.Tensor:
        """Which of the buffer's elements AdamW decays (bool, laid out like it; padding does not): each parameter's
        elements by its shape (``OptimizerSpec.decays``)."""
        mask = torch.zeros(self.padded, dtype=torch.bool, device=self.buffer.device)
        for p, o in zip(self.params, self.offsets, strict=True):
            mask[o:o + p.numel()] = spec.decays(p.shape)
        return mask

    def flatten_grads(self) -> torch.Tensor:
        """The parameters' gradients laid out like the buffer (zeros for padding and missing grads)."""
        flat = torch.zeros_like(self.buffer)
        for p, view in zip(self.params, self.views(flat), strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
        return flat

    def gather(self, shard: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """All-gather every rank's ``shard`` into a full flat tensor (``out``, or a new one)."""
        out = torch.empty_like(self.buffer) if out is None else out
        if self.n == 1:
            out.copy_(shard)
        else:
            _all_gather(out, shard.contiguous().clone(), group=self.group)
        return out

    def reduce_scatter_mean(self, flat: torch.Tensor, divisor: int | None = None) -> torch.Tensor:
        """This rank's shard of the sum of ``flat`` over the group (and over the replicas: hybrid sharding's
        all-reduce of each shard across them) / ``divisor`` (default every rank that summed: the average)."""
        out = flat[self.shard].clone() if self.n == 1 else torch.empty_like(flat[self.shard])
        if self.n > 1:
            _reduce_scatter(out, flat.contiguous(), group=self.group)
        if self.replicas > 1:
            dist.all_reduce(out, group=self.replicate)
        return out / (divisor or self.n * self.replicas)
