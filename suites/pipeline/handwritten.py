"""A user's own 1F1B, written as Megatron-LM's ``forward_backward_pipelining_without_interleaving`` is: a warm-up of
``min(p - rank - 1, m)`` forwards, the steady one-forward-one-backward, a cool-down of the warm-up's backwards.

No schedule as data, no validator: each rank runs its loop and blocks in its receives, so a count one rank gets wrong
is a receive no peer ever sends — a true hang (the planted ``suites.pipeline.impls:UnclampedCooldown1F1B``), which
the suite must turn into a fail verdict naming the waiting ranks within the World's hang window. Other schedules and
virtual stages go to the reference.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference.errors import Unsupported
from reference.pipeline.runtime import ReferencePipeline


class HandWritten1F1B:
    """1F1B with one stage per rank, equal microbatches (Megatron's fixed tensor shape), receives waited where posted
    and sends at the end of the step (gloo: tagged by microbatch and direction)."""

    clamp_cooldown = True

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        if schedule != "1f1b" or virtual_stages != 1:
            return ReferencePipeline().build(stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn,
                                             batch_size, sample_shape, group)
        if dist.get_backend(group) != "gloo":
            raise Unsupported("the hand-written 1F1B runs on gloo only: it tells its messages apart by tag, and waits "
                              "for a receive on the host (nccl matches point-to-point messages by order, and its wait "
                              "does not block the host).")
        if batch_size % num_microbatches:
            raise Unsupported(f"equal microbatches only (Megatron's fixed tensor shape): {batch_size} rows do not "
                              f"split into {num_microbatches}.")
        return _Loop(self.clamp_cooldown, next(iter(stages.values())), num_stages, num_microbatches, loss_fn,
                     (batch_size // num_microbatches, *sample_shape), group)


class _Loop:
    def __init__(self, clamp_cooldown, stage, p, m, loss_fn, shape, group):
        self.stage, self.m, self.loss_fn, self.shape, self.group = stage, m, loss_fn, shape, group
        self.rank = dist.get_rank(group)
        self.first, self.last = self.rank == 0, self.rank == p - 1
        warmup = p - self.rank - 1
        self.forwards = min(warmup, m)
        self.cooldown = self.forwards if clamp_cooldown else warmup
        param = next(stage.parameters())
        self.dtype, self.device = param.dtype, param.device

    def _recv(self, peer: int, microbatch: int, direction: int) -> torch.Tensor:
        buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        dist.irecv(buf, group=self.group, group_src=peer, tag=2 * microbatch + direction).wait()
        return buf

    def step(self, inputs, targets):
        xs = inputs.tensor_split(self.m) if self.first else None
        ts = targets.tensor_split(self.m) if self.last else None
        held, sends, losses = [], [], []

        def forward(j):
            x = xs[j] if self.first else self._recv(self.rank - 1, j, 0).requires_grad_()
            y = self.stage(x)
            if self.last:
                y = self.loss_fn(y, ts[j])
                losses.append(y.detach())
            else:
                sends.append(dist.isend(y.detach(), group=self.group, group_dst=self.rank + 1, tag=2 * j))
            held.append((j, x, y))

        def backward(j):
            g = None if self.last else self._recv(self.rank + 1, j, 1)
            k, x, y = held.pop(0)
            assert k == j, (k, j)
            torch.autograd.backward(y, g)
            if not self.first:
                sends.append(dist.isend(x.grad, group=self.group, group_dst=self.rank - 1, tag=2 * j + 1))

        for j in range(self.forwards):
            forward(j)
        for j in range(self.m - self.forwards):
            forward(self.forwards + j)
            backward(j)
        for j in range(self.cooldown):
            backward(self.m - self.forwards + j)
        for work in sends:
            work.wait()
        return torch.stack(losses).sum() if losses else None
