"""A data-parallel implementation to copy from: after backward, all-reduce every gradient and divide
by the group size, then step a full optimizer on every rank (ZeRO stage 0, no sharding). Run it with

    pytest suites/zero --impl docs.examples.allreduce_data_parallel:AllReduceDataParallel

ZeRO stages 1-3 are ``Unsupported``; memory is measured from the tensors it keeps alive.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F

from harness.contracts import Unsupported
from reference.zero.accounting import held_bytes, optimizer_state_tensors


class AllReduceDataParallel:
    """The ZeRO contract (harness/contracts/zero.py) at stage 0."""

    def build(self, model, optimizer, stage, group=None):
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3; got {stage!r}.")
        if stage != 0:
            raise Unsupported(f"this example is plain data parallelism (stage 0), not ZeRO stage {stage}.")
        return _Trainer(model, optimizer, group)


class _Trainer:
    def __init__(self, model, spec, group):
        self.model, self.spec, self.group = model, spec, group
        self.optimizer = spec.build(model.parameters())

    def step(self, x, y) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        n = dist.get_world_size(self.group)
        for p in self.model.parameters():
            dist.all_reduce(p.grad, group=self.group)
            p.grad /= n  # the mean over ranks: one device's gradient of the whole batch's mean loss
        self.grad_bytes = held_bytes(p.grad for p in self.model.parameters())
        self.optimizer.step()
        return float(loss.detach())

    def full_params(self) -> dict:
        return {k: p.detach().clone() for k, p in self.model.named_parameters()}

    def full_grads(self) -> dict:
        return {k: p.grad.detach().clone() for k, p in self.model.named_parameters()}

    def full_optimizer_state(self) -> dict:
        return {k: {key: self.optimizer.state[p][key].clone() for key in self.spec.state_keys}
                for k, p in self.model.named_parameters()}

    def memory(self) -> dict:
        return {"params": held_bytes(self.model.parameters()), "grads": self.grad_bytes,
                "optimizer": held_bytes(optimizer_state_tensors(self.optimizer))}
