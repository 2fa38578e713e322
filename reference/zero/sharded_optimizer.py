"""ZeRO stages 1 and 2 (Rajbhandari et al. 2020): the optimizer state is sharded over the data-parallel
group, each rank stepping only its range of the flat parameter buffer (``flat.py``).

Step: the flat gradients are reduce-scattered (each rank receives the average of its range), the rank's
optimizer steps its range, and the updated ranges are all-gathered back into every rank's full buffer.
Communication: reduce-scatter + all-gather of Psi elements = 2 (N - 1)/N Psi sent per rank, the same
as data parallelism's all-reduce (the paper's "2 Psi").

Memory per rank (Psi parameters, K bytes of optimizer state per parameter, padding aside):
  stage 1: Psi params + Psi grads + K Psi / N    (the full gradient buffer stays allocated)
  stage 2: Psi params + Psi / N grads + K Psi / N  (only the reduced shard of the gradients is kept;
           this reference reduces after backward, so the full gradients live until then — DeepSpeed
           reduces buckets during backward so they never are all alive at once)
"""

from __future__ import annotations

import torch
from torch import nn

from .flat import FlatParams
from .optim import OptimizerSpec


class ShardedOptimizer:
    def __init__(self, module: nn.Module, spec: OptimizerSpec, stage: int, group=None, divisor: int | None = None,
                 replicate=None, shards: dict | None = None):
        """``shards``: the TP-split matrices a matrix optimizer (Muon) gathers whole (``OptimizerSpec.build_flat``)."""
        if stage not in (1, 2):
            raise ValueError(f"ShardedOptimizer implements ZeRO stages 1 and 2; got {stage}.")
        self.module, self.spec, self.stage, self.group = module, spec, stage, group
        self.divisor = divisor
        """The reduction's divisor (default the group's size: the average) — an expert's, whose EP group already
        collected its tokens' gradients, is the whole dp x cp (``reference.stack.compose``)."""
        self.flat = FlatParams([p for p in module.parameters()], group, replicate)  # replicate: hybrid sharding
        # The master shard is a view of this rank's range: stepping it updates the flat buffer in place.
        self.master = nn.Parameter(self.flat.buffer[self.flat.shard])
        self.optimizer = spec.build_flat(self.master, self.flat, module.named_parameters(), shards)
        self._grads: torch.Tensor | None = None

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        self.master.grad, self._grads = None, None

    def step(self) -> None:
        """After backward: reduce-scatter the gradients, step this rank's shard, all-gather the params."""
        self.reduce()
        self.update()

    def grad_tensors(self) -> list:
        """The gradient tensors this rank holds (its full buffer in stage 1, its shard in stage 2)."""
        return [p.grad for p in self.flat.params] + [self.master.grad]

    def reduce(self) -> None:
        """Each rank receives the average of its range of the gradients (stage 2 frees the rest)."""
        flat = self.flat
        grads = flat.flatten_grads()
        shard = flat.reduce_scatter_mean(grads, self.divisor)
        if self.stage == 1:
            grads[flat.shard] = shard  # the averaged shard lives in the (kept) full buffer
            for p, view in zip(flat.params, flat.views(grads), strict=True):
                p.grad = view
            self._grads, self.master.grad = grads, grads[flat.shard]
        else:
            for p in flat.params:
                p.grad = None
            self.master.grad = shard

    def update(self) -> None:
        """Step this rank's shard, then all-gather every rank's updated range into the full buffer."""
        flat = self.flat
        self.optimizer.step()
        with torch.no_grad():
            flat.gather(self.master.data, out=flat.buffer)

    def full_grads(self) -> list[torch.Tensor]:
        """Every parameter's averaged gradient of the last step (gathered from the shards)."""
        return [v.clone() for v in self.flat.views(self.flat.gather(self.master.grad))]

    def full_state(self) -> dict[str, list[torch.Tensor]]:
        state = self.optimizer.state[self.master]
        return {key: [v.clone() for v in self.flat.views(self.flat.gather(state[key]))]
                for key in self.spec.state_keys}
