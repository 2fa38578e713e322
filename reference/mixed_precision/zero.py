"""Mixed-precision data parallelism and ZeRO 1-3 (Micikevicius et al. 2018; Rajbhandari et al. 2020): the
model's parameters, activations and gradients in ``dtype`` (bf16 or fp16), an fp32 master copy of the
parameters and fp32 optimizer state — for Adam K = 12 bytes per parameter (master 4 + m 4 + v 4), the
ZeRO paper's 2 Psi + 2 Psi + K Psi.

Step (``reduce()`` then ``update()``): the low-precision gradients are averaged over the group in
``reduce_dtype`` — fp32 (the gradient cast up first: FSDP's ``reduce_dtype=float32``) or the low
precision itself (Megatron's default, DeepSpeed's fp16 path) — stage 0 all-reduces them, stages 1-2
reduce-scatter the flat buffer, stage 3 reduce-scatters each unit's as its backward completes; the
reduced gradient is kept in the low precision (``dtype``: 2 Psi, or 2 Psi / N from stage 2). The update
casts this rank's part to fp32, unscales it (``loss_scaler``, fp16: an inf / NaN on any rank skips the
step everywhere), optionally clips it, steps the fp32 master, and writes the master rounded to ``dtype``
back into the parameters (stages 1-3: this rank's range, all-gathered as in ``reference.zero``).

Memory per rank (measured by ``held_bytes``; Psi parameters, N ranks, padding aside):
  stage 0: 2 Psi + 2 Psi + K Psi    stage 2: 2 Psi + 2 Psi / N + K Psi / N
  stage 1: 2 Psi + 2 Psi + K Psi / N    stage 3: (2 + 2 + K) Psi / N (+ one unit's parameters in use)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..clipping import clip_grad_norm_
from ..zero.flat import FlatParams
from ..zero.optim import OptimizerSpec
from ..zero.stage3 import Zero3
from .scaler import DynamicLossScaler

LOW = (torch.bfloat16, torch.float16)


class MixedPrecisionZero:
    def __init__(self, module: nn.Module, spec: OptimizerSpec, stage: int, group=None, *,
                 reduce_dtype: torch.dtype = torch.float32, loss_scaler: DynamicLossScaler | None = None,
                 max_grad_norm: float | None = None, divisor: int | None = None, replicate=None):
        """``divisor``: the reduction's (default every rank that sums: the average; stages 0-2) — an expert's, whose
        EP group already collected its tokens' gradients, is the whole dp x cp (``reference.stack.compose``).
        ``replicate``: hybrid sharding's replica group (stages 1-3: ``group`` is then the shard group, each reduced
        shard all-reduced across ``replicate``)."""
        dtype = next(module.parameters()).dtype
        if divisor is not None and stage == 3:
            raise ValueError("a reduction divisor applies to ZeRO stages 0-2.")
        if dtype not in LOW:
            raise ValueError(f"mixed precision trains a bfloat16 or float16 model; this one is {dtype}.")
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}.")
        if reduce_dtype not in (torch.float32, dtype):
            raise ValueError(f"reduce_dtype must be float32 or the model's {dtype}; got {reduce_dtype}.")
        if replicate is not None and stage == 0:
            raise ValueError("hybrid sharding shards ZeRO 1-3's state within a group; stage 0 shards none.")
        self.module, self.spec, self.stage, self.group, self.dtype = module, spec, stage, group, dtype
        self.reduce_dtype, self.loss_scaler, self.max_grad_norm = reduce_dtype, loss_scaler, max_grad_norm
        self.n = dist.get_world_size(group)
        self.divisor = divisor or self.n * (dist.get_world_size(replicate) if replicate is not None else 1)
        if stage == 3:
            self.zero3 = Zero3(module, spec, group, reduce_dtype=reduce_dtype, replicate=replicate)
            self.parts = [u.shard for u in self.zero3.units]  # this rank's low-precision shards
            masks = [u.flat.decaying(spec)[u.flat.shard] for u in self.zero3.units]
        else:
            self.flat = FlatParams(list(module.parameters()), group, replicate)
            self.parts = [self.flat.buffer[self.flat.shard] if stage else self.flat.buffer]
            masks = [self.flat.decaying(spec)[self.flat.shard if stage else slice(None)]]
        self.masters = [nn.Parameter(p.detach().float().clone()) for p in self.parts]
        self.optimizer = spec.build(self.masters, masks)  # AdamW's rule by each element's parameter
        self.grads: list[torch.Tensor | None] = [None] * len(self.parts)
        self.last_grad_norm: float | None = None

    @property
    def scale(self) -> float:
        """Multiply the loss by this before backward (1 without a loss scaler)."""
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        if self.stage == 3:
            self.zero3.zero_grad()
        self.grads = [None] * len(self.parts)

    def reduce(self) -> None:
        """Average the gradients over the group (in ``reduce_dtype``), keep this rank's part in ``dtype``."""
        if self.stage == 3:  # each unit reduce-scattered during backward
            self.grads = [p.grad for p in self.parts]
            return
        low = self.flat.flatten_grads()  # the full low-precision gradient buffer (2 Psi)
        flat = low.to(self.reduce_dtype)
        for p in self.flat.params:
            p.grad = None
        if self.stage == 0:
            if self.n > 1:
                dist.all_reduce(flat, group=self.group)
            low.copy_(flat / self.divisor)
            self.grads = [low]
        else:
            shard = self.flat.reduce_scatter_mean(flat, self.divisor).to(self.dtype)
            if self.stage == 1:  # the full buffer stays allocated, the reduced shard written into it
                low[self.flat.shard] = shard
                shard = low[self.flat.shard]
            self.grads = [shard]
        if self.stage < 2:
            for p, view in zip(self.flat.params, self.flat.views(low), strict=True):
                p.grad = view
        del flat

    def held_grads(self) -> list[torch.Tensor | None]:
        """The gradient tensors this rank holds once reduced (each storage counted once by held_bytes)."""
        return self.grads + [p.grad for p in self.module.parameters()]

    def unscale(self, scale: float | None = None) -> list[torch.Tensor]:
        """Set each fp32 master's gradient to this rank's reduced gradient / ``scale`` (default: the loss
        scaler's) and return them — for a caller (the 3D stack) that checks and clips them over its own
        groups before ``apply``."""
        scale = self.scale if scale is None else scale
        for master, g in zip(self.masters, self.grads, strict=True):
            master.grad = g.float() / scale  # a power of two: exact
        return [m.grad for m in self.masters]

    def update(self) -> bool:
        """Step the fp32 master from the reduced gradients; returns False when the loss scaler skipped."""
        grads = self.unscale()
        if self.loss_scaler is not None and not self.loss_scaler.update_from(grads, {"dp": self.group}):
            return False
        if self.max_grad_norm is not None:
            norm = clip_grad_norm_(self.masters, self.max_grad_norm, {"dp": self.group},
                                   dp_sharded=self.masters if self.stage else ())
            self.last_grad_norm = float(norm)
        self.apply()
        return True

    def apply(self) -> None:
        """Step the fp32 masters from their (unscaled, checked, clipped) gradients and write them, rounded
        to ``dtype``, back into the parameters (stages 1-2: this rank's range, all-gathered)."""
        self.optimizer.step()
        with torch.no_grad():
            for part, master in zip(self.parts, self.masters, strict=True):
                part.copy_(master.to(self.dtype))
            if self.stage in (1, 2):
                self.flat.gather(self.parts[0], out=self.flat.buffer)
        for master in self.masters:
            master.grad = None

    def full_masters(self) -> list[torch.Tensor]:
        """Every parameter's fp32 master, full, in ``module.parameters()`` order."""
        units = self.zero3.units if self.stage == 3 else [self]
        out = {}
        for unit, master in zip(units, self.masters, strict=True):
            flat = unit.flat
            full = master.data if self.stage == 0 else flat.gather(
                master.data, out=torch.empty(flat.padded, dtype=torch.float32, device=master.device))
            out.update({id(p): v.clone() for p, v in zip(flat.params, flat.views(full), strict=True)})
        return [out[id(p)] for p in self.module.parameters()]
