"""Pipeline implementations loaded by spec in the suites: planted bugs the property must catch."""

from __future__ import annotations

from harness.adapters.torch.pipeline import TorchPipeline
from reference.pipeline.runtime import ReferencePipeline


class AveragesMicrobatches(ReferencePipeline):
    """Planted bug: each microbatch's loss divided by m (a mean where the contract says sum)."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        def mean_loss(out, target):
            return loss_fn(out, target) / num_microbatches

        return super().build(stages, num_stages, schedule, num_microbatches, virtual_stages, mean_loss,
                             batch_size, sample_shape, group)


class TorchDefaultScaling(TorchPipeline):
    """Planted bug (torch's own default): scale_grads=True divides gradients by m — wrong for a sum-reduced
    loss."""

    scale_grads = True


class _Wrapped:
    def __init__(self, inner, after):
        self.inner, self.after = inner, after

    def step(self, inputs, targets):
        return self.after(self.inner.step(inputs, targets))


class DropsAGradient(ReferencePipeline):
    """Planted bug: the first stage's first parameter is left without a gradient."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        inner = super().build(stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
                              sample_shape, group)

        def drop(loss):
            if 0 in stages:
                next(stages[0].parameters()).grad = None
            return loss

        return _Wrapped(inner, drop)


class ReturnsNoLoss(ReferencePipeline):
    """Planted bug: step returns None on the last stage's rank instead of the summed loss."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        return _Wrapped(super().build(stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn,
                                      batch_size, sample_shape, group), lambda loss: None)


class LastStageRaises(ReferencePipeline):
    """Planted: the last stage's rank raises on uneven microbatches while the other stages block in their
    sends and receives."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        inner = super().build(stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
                              sample_shape, group)
        if num_stages - 1 not in stages or batch_size % num_microbatches == 0:
            return inner

        def refuse(_loss):
            raise ValueError(f"uneven microbatches ({batch_size} rows in {num_microbatches}) on the last stage")

        return _Wrapped(inner, refuse)
