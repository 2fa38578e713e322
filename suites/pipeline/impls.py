"""Pipeline implementations loaded by spec in the suites: planted bugs the property must catch."""

from __future__ import annotations

from harness.adapters.torch_pipeline import TorchPipeline
from reference.pipeline.runtime import ReferencePipeline


class AveragesMicrobatches(ReferencePipeline):
    """Planted bug: each microbatch's loss divided by m (a mean where the contract says sum)."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, *args, **kwargs):
        def mean_loss(out, target):
            return loss_fn(out, target) / num_microbatches

        return super().build(stages, num_stages, schedule, num_microbatches, virtual_stages, mean_loss,
                             *args, **kwargs)


class TorchDefaultScaling(TorchPipeline):
    """torch's own default, scale_grads=True: gradients divided by m — wrong for a sum-reduced loss."""

    scale_grads = True
