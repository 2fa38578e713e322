"""ZeRO stage 3: parameters sharded too. Every module that owns parameters is a unit with its own flat
buffer (``flat.py``); a rank keeps only its shard of each. A unit's full parameters are all-gathered
just before its forward and freed just after, all-gathered again when the gradient reaches its output
(a tensor hook: just before its backward), and once
its gradients are complete they are reduce-scattered (each rank keeps the average of its shard) and
the full parameters freed again. The optimizer steps the shards; nothing is gathered after the step.

Freeing resizes the flat buffer's storage to 0 bytes and gathering resizes it back, so the parameters'
views (and the tensors autograd saved) stay valid; the gather writes through the buffer, which does not
share the parameters' version counters (PyTorch FSDP's technique).

Communication per step: all-gather forward + all-gather backward + reduce-scatter = 3 (N - 1)/N Psi
elements sent per rank (the paper's "3 Psi", 1.5x data parallelism).
Memory per rank: (Psi params + Psi grads + K Psi) / N, plus one unit's full parameters while it runs.
"""

from __future__ import annotations

import torch
from torch import nn

from .flat import FlatParams
from .optim import OptimizerSpec


class _Unit:
    def __init__(self, module: nn.Module, group, reduce_dtype: torch.dtype | None = None, replicate=None):
        self.params, self.reduce_dtype = list(module.parameters(recurse=False)), reduce_dtype
        self.flat = FlatParams(self.params, group, replicate)
        self.shard = nn.Parameter(self.flat.buffer[self.flat.shard].clone())
        self._bytes = self.flat.buffer.untyped_storage().nbytes()
        self._ready = 0
        self.release()
        module.register_forward_pre_hook(lambda mod, args: self.materialize())
        module.register_forward_hook(self._after_forward)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _after_forward(self, module, args, out) -> None:
        """Free the full parameters, and gather them again when the gradient reaches this output — just
        before the module's own backward runs."""
        self.release()
        for t in out if isinstance(out, tuple) else (out,):
            if torch.is_tensor(t) and t.requires_grad:
                t.register_hook(lambda grad: self.materialize())

    @property
    def materialized(self) -> bool:
        return self.flat.buffer.untyped_storage().nbytes() > 0

    def materialize(self) -> None:
        if not self.materialized:
            self.flat.buffer.untyped_storage().resize_(self._bytes)
            with torch.no_grad():
                self.flat.gather(self.shard.data, out=self.flat.buffer)

    def release(self) -> None:
        self.flat.buffer.untyped_storage().resize_(0)

    def _grad_ready(self, p) -> None:
        self._ready += 1
        if self._ready < len(self.params):
            return
        self._ready = 0
        grads = self.flat.flatten_grads()
        grads = grads.to(self.reduce_dtype) if self.reduce_dtype is not None else grads
        shard = self.flat.reduce_scatter_mean(grads).to(self.shard.dtype)  # reduced in reduce_dtype, kept in ours
        self.shard.grad = shard if self.shard.grad is None else self.shard.grad + shard
        for q in self.params:
            q.grad = None
        self.release()


class Zero3:
    def __init__(self, module: nn.Module, spec: OptimizerSpec, group=None, reduce_dtype: torch.dtype | None = None,
                 replicate=None):
        """``reduce_dtype``: the dtype gradients are reduce-scattered in (default: the parameters'); ``replicate``:
        hybrid sharding's group of replicas (each reduced shard all-reduced across it)."""
        self.module, self.spec, self.group = module, spec, group
        owners = [m for m in module.modules() if next(m.parameters(recurse=False), None) is not None]
        self.units = [_Unit(m, group, reduce_dtype, replicate) for m in owners]
        self.optimizer = spec.build([u.shard for u in self.units],  # AdamW's rule by each element's parameter
                                    [u.flat.decaying(spec)[u.flat.shard] for u in self.units])

    def zero_grad(self) -> None:
        for u in self.units:
            u.shard.grad = None

    def grad_tensors(self) -> list:
        """The gradient shards this rank holds (reduced as each unit's backward completed)."""
        return [u.shard.grad for u in self.units]

    def reduce(self) -> None:
        """Nothing left to do: each unit reduce-scattered its gradients when its backward completed."""

    def update(self) -> None:
        self.optimizer.step()

    def step(self) -> None:
        self.update()

    def _gathered(self, shard_of) -> list[torch.Tensor]:
        """Per parameter (in ``module.parameters()`` order) the gathered full tensor of ``shard_of(unit)``."""
        out = {}
        for u in self.units:
            for p, v in zip(u.params, u.flat.views(u.flat.gather(shard_of(u))), strict=True):
                out[id(p)] = v.clone()
        return [out[id(p)] for p in self.module.parameters()]

    def full_params(self) -> list[torch.Tensor]:
        return self._gathered(lambda u: u.shard.data)

    def full_grads(self) -> list[torch.Tensor]:
        return self._gathered(lambda u: u.shard.grad)

    def full_state(self) -> dict[str, list[torch.Tensor]]:
        return {key: self._gathered(lambda u, key=key: self.optimizer.state[u.shard][key])
                for key in self.spec.state_keys}
