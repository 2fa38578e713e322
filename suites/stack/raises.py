"""A stack that raises where a bench times it — not a planted bug (there is nothing numerical to catch): the benches'
per-case verdict (``harness.runtime.bench_case``) is held with it. Loaded by spec like a user's stack."""

from __future__ import annotations

import torch.distributed as dist

from harness.adapters.reference.stack import ReferenceStack, ReferenceStackTrainer


class _RaisesOnRankOne(ReferenceStackTrainer):
    steps = 0

    def step(self, tokens, targets):
        self.steps += 1
        if self.steps >= 3 and dist.get_rank() == 1:  # rank 0 waits for it in the step's collectives
            raise RuntimeError("out of pinned memory at the third step")
        return super().step(tokens, targets)

    def save(self, directory) -> None:
        if dist.get_rank() == 1:
            raise OSError("checkpoint volume is read-only")
        super().save(directory)


class RaisesAtPipeline(ReferenceStack):
    """The reference's stack, except at pp > 1: rank 1 raises a plain error from its third ``step`` on and at
    every ``save``."""

    def build(self, spec, layout, recipe, group=None):
        trainer = super().build(spec, layout, recipe, group)
        return _RaisesOnRankOne(spec, layout, recipe) if layout.pp > 1 else trainer
