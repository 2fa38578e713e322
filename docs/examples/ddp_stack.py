"""A whole-stack example to copy from: the family's plain torch model under ``DistributedDataParallel``,
wrapped for the stack contract (``harness/contracts/stack.py``). Data parallelism only — any other layout
is ``Unsupported`` (reported as such, never as a pass). Run it through the suite with

    pytest suites/stack --impl docs.examples.ddp_stack:DDPStack
    paritybench test stack --impl docs.examples.ddp_stack:DDPStack        # installed
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from harness.contracts import Unsupported


class DDPStack:
    def build(self, spec, layout, recipe, group=None):
        if (layout.pp, layout.tp, layout.cp, layout.zero) != (1, 1, 1, 0) or layout.checkpointing or layout.extra:
            raise Unsupported("the DDP example trains data parallel only (pp = tp = cp = 1, zero 0, no checkpointing).")
        if spec.extra or spec.dtype not in ("float64", "float32"):
            raise Unsupported("the DDP example trains float64 / float32 models of the gpt and llama families.")
        return DDPTrainer(spec, recipe)


class DDPTrainer:
    def __init__(self, spec, recipe):
        self.spec, self.recipe = spec, recipe
        self.model = spec.build(0)  # reference.models: a plain torch module
        self.ddp = DistributedDataParallel(self.model)
        self.optimizer = recipe.optimizer.build(self.model.parameters())
        self.norm = None

    def load_dense(self, state: dict) -> None:
        with torch.no_grad():
            self.model.load_state_dict(state)

    def step(self, tokens, targets) -> float:
        n, r = dist.get_world_size(), dist.get_rank()
        if len(tokens) % n:
            raise ValueError(f"{len(tokens)} rows do not split evenly over {n} data-parallel ranks.")
        rows = len(tokens) // n
        k = self.recipe.accumulation
        # the loss is the mean over the global batch's counted targets (-100: padding). DDP averages the n
        # replicas, so each divides its summed loss by 1 / n of that count — never by its own count, nor each
        # micro-step by its own (a padded batch counts differently per replica and micro-step)
        share = int((targets != -100).sum()) / n
        mine = slice(r * rows, (r + 1) * rows)
        tokens, targets = tokens[mine], targets[mine]
        self.optimizer.zero_grad()
        total = 0.0
        for a in range(k):
            part = slice(a * rows // k, (a + 1) * rows // k)
            logits = self.ddp(tokens[part])  # through DDP's forward: its reducer is prepared for this backward
            loss = F.cross_entropy(logits.flatten(0, 1), targets[part].flatten(), reduction="sum") / share
            if a < k - 1:
                with self.ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += float(loss.detach())
        self.norm = None
        if self.recipe.max_grad_norm is not None:  # every rank holds the averaged gradient: a local norm
            self.norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.max_grad_norm,
                                                             self.recipe.norm_type))
        self.optimizer.step()
        mean = torch.tensor([total], dtype=torch.float64)
        dist.all_reduce(mean)
        return float(mean) / n

    def dense_state(self) -> dict:
        state = {n: {k: self.optimizer.state[p][k].detach().clone() for k in self.recipe.optimizer.state_keys}
                 for n, p in self.model.named_parameters()}
        return {"params": {n: t.detach().clone() for n, t in self.model.state_dict().items()}, "optimizer": state,
                "grad_norm": self.norm}
