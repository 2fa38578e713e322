"""The ``torch`` data-parallel / ZeRO implementation on CPU/gloo (or the current backend):

  stage 0: DistributedDataParallel (gradient_as_bucket_view, so ``.grad`` is DDP's bucket memory)
  stage 1: DDP + ZeroRedundancyOptimizer (optimizer state sharded by whole parameters, not elements)
  stage 2: FSDP2 ``fully_shard`` per parameter-owning module + root, reshard_after_forward=False
  stage 3: the same with reshard_after_forward=True
  hybrid sharding (``replicate``): FSDP2 on a 2-D (replicate, shard) mesh — torch's HSDP — at stages 2 and 3,
  the degenerate (1, n) and (n, 1) meshes included; offload (``offload``): FSDP2's ``CPUOffloadPolicy``, stages 2-3

FSDP2 reshards after backward in both configurations, so at rest (after a step) stage 2 holds sharded
parameters like stage 3; it differs only between forward and backward. Memory is measured from the
tensors this rank keeps (DTensor local shards; ZeroRedundancyOptimizer's local optimizer state).

A ``StepRecipe`` as torch users write it: accumulation under DDP's ``no_sync()`` (stages 0-1) or FSDP2's
``set_requires_gradient_sync(False)`` (stages 2-3) for the first k - 1 micro-steps, each loss divided by
k; clipping with ``torch.nn.utils.clip_grad_norm_`` over the module's parameters (DTensor gradients under
FSDP2: the returned norm is a DTensor, read with ``full_tensor()``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from harness.runtime.world import rank_device
from reference.zero.accounting import held_bytes, optimizer_state_tensors


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _local(t):
    return None if t is None else (t.to_local() if hasattr(t, "to_local") else t)


class TorchZero:
    def build(self, model, optimizer, stage: int, group=None, *, recipe=None, replicate: int | None = None,
              offload: bool = False):
        from reference.errors import Unsupported
        from reference.zero import StepRecipe

        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}.")
        n = dist.get_world_size(group)
        if replicate is not None and (not isinstance(replicate, int) or replicate < 1 or n % replicate):
            raise ValueError(f"replicate ({replicate!r}) must be a whole number dividing the {n} ranks.")
        if replicate not in (None, 1) and stage < 2:
            raise Unsupported("torch's hybrid sharding is FSDP2 on a 2-D (replicate, shard) mesh (stages 2 and 3); "
                              "DDP and ZeroRedundancyOptimizer have none.")
        if replicate is not None and stage >= 2 and group not in (None, dist.group.WORLD):
            raise Unsupported("this adapter builds FSDP2's 2-D mesh over the whole world (init_device_mesh).")
        replicate = replicate if stage >= 2 else None  # one replica at stages 0-1: plain DDP
        if offload and stage < 2:
            raise Unsupported("torch offloads with FSDP2's CPUOffloadPolicy (stages 2 and 3); DDP and "
                              "ZeroRedundancyOptimizer keep their state on the device.")
        return _Trainer(model, optimizer, stage, group or dist.group.WORLD, recipe or StepRecipe(), replicate,
                        offload)


class _Trainer:
    def __init__(self, model, spec, stage, group, recipe, replicate: int | None = None, offload: bool = False):
        self.spec, self.stage, self.group, self.recipe = spec, stage, group, recipe
        self.last_grad_norm: float | None = None
        if stage <= 1:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(model, process_group=group, gradient_as_bucket_view=True)
            self.inner = model
            if stage == 1:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                if spec.name == "muon":
                    from reference.errors import Unsupported

                    raise Unsupported("torch's ZeroRedundancyOptimizer steps each rank's whole parameters with one "
                                      "optimizer class: Muon with its AdamW half is not composed with it here.")
                cls, kwargs = spec.torch_class()
                # AdamW's rule as parameter groups (ZeroRedundancyOptimizer keeps them: each rank's share per group)
                self.optimizer = ZeroRedundancyOptimizer(spec.param_groups(model.parameters()), optimizer_class=cls,
                                                         process_group=group, **kwargs)
            else:
                self.optimizer = spec.build(model.parameters())
        else:
            from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

            n = dist.get_world_size(group)
            # offload: the sharded parameters, their gradients and the optimizer's state on the host, the step there
            policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
            mesh = (DeviceMesh.from_group(group, rank_device().type) if replicate is None else  # HSDP: a 2-D mesh
                    init_device_mesh(rank_device().type, (replicate, n // replicate),
                                     mesh_dim_names=("replicate", "shard")))
            for module in list(model.modules())[1:]:
                if next(module.parameters(recurse=False), None) is not None:
                    fully_shard(module, mesh=mesh, reshard_after_forward=stage == 3, offload_policy=policy)
            fully_shard(model, mesh=mesh, reshard_after_forward=stage == 3, offload_policy=policy)
            self.model = self.inner = model
            self.optimizer = spec.build(model.parameters())

    def _quiet(self, sync: bool):
        """DDP's no_sync, or FSDP2's gradient sync switched off, for a micro-step that must not reduce."""
        if sync:
            if self.stage >= 2:
                self.model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self.stage <= 1:
            return self.model.no_sync()
        self.model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()

    def step(self, x, y) -> float:
        self.optimizer.zero_grad(set_to_none=self.stage >= 2)
        micro, total, share = self.recipe.split(x, y), 0.0, self.recipe.share(y, self.group)
        for i, (xm, ym) in enumerate(micro):
            with self._quiet(i == len(micro) - 1):
                loss = self.recipe.micro_loss(self.model(xm), ym, share)  # / k, or masked: / its share
                loss.backward()
            total += float(loss.detach())
        self.grad_bytes = held_bytes(_local(p.grad) for p in self.inner.parameters())
        if self.recipe.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.inner.parameters(), self.recipe.max_grad_norm,
                                                  self.recipe.norm_type)
            self.last_grad_norm = float(_full(norm))
        self.optimizer.step()
        return total

    def full_params(self) -> dict:
        return self._full_tensors({k: p.detach() for k, p in self.inner.named_parameters()})

    def full_grads(self) -> dict:
        return self._full_tensors({k: p.grad for k, p in self.inner.named_parameters()})

    def _full_tensors(self, tree: dict) -> dict:
        """Every DTensor's full tensor in one exchange (``harness.stack.dense.full_tensors``), on its own device."""
        from harness.stack.dense import full_tensors, on_their_devices

        return on_their_devices(full_tensors(tree, self.group), tree)

    def _local_state(self):
        return self.optimizer.optim.state if self.stage == 1 else self.optimizer.state

    def full_optimizer_state(self) -> dict:
        state = self._local_state()
        out = {}
        for name, p in self.inner.named_parameters():
            out[name] = {}
            for key in self.spec.state_keys:
                if self.stage == 1:  # each parameter's state lives on the one rank that owns it
                    t = state[p][key].clone() if p in state else torch.zeros_like(p.detach())
                    dist.all_reduce(t, group=self.group)
                    out[name][key] = t
                else:
                    out[name][key] = state[p][key]
        return self._full_tensors(out) if self.stage != 1 else out

    def memory(self) -> dict:
        params = list(self.inner.parameters())
        optim = self.optimizer.optim if self.stage == 1 else self.optimizer
        return {"params": held_bytes(_local(p.detach()) for p in params),
                "grads": self.grad_bytes,
                "optimizer": held_bytes(_local(t) for t in optimizer_state_tensors(optim))}
