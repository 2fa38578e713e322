"""Pipeline implementations loaded by spec in the suites: planted bugs the property must catch."""

from __future__ import annotations

from harness.adapters.torch.pipeline import TorchPipeline
from reference.pipeline.runtime import PipelineRuntime, ReferencePipeline

from . import planted_schedules
from .handwritten import HandWritten1F1B


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


class UnclampedCooldown1F1B(HandWritten1F1B):
    """Planted: the cool-down runs ``p - rank - 1`` backwards where only ``min(p - rank - 1, m)`` forwards ran. At
    m >= p - 1 the two counts agree; at m < p - 1 rank 0 (and every rank with p - rank - 1 > m) waits for the
    gradient of a microbatch that does not exist, and its peers, in the next step, for rank 0: a hang."""

    clamp_cooldown = False


class _PlantedSchedule(ReferencePipeline):
    """Our runtime over a generated schedule broken by ``plant`` where the schedule is one the plant applies to."""

    applies_to: tuple[str, ...] = ()

    @staticmethod
    def plant(schedule):
        raise NotImplementedError

    def schedule(self, schedule, num_stages, num_microbatches, virtual_stages, batch_size, group=None):
        built = ReferencePipeline.schedule(schedule, num_stages, num_microbatches, virtual_stages, batch_size, group)
        return type(self).plant(built) if schedule in self.applies_to else built


class WeightBeforeInput(_PlantedSchedule):
    """Planted: a W runs before its I (the split backward's order broken)."""

    applies_to = ("zb-h1", "interleaved-zb", "zbv")
    plant = staticmethod(planted_schedules.weight_before_input)


class VStageMisplaced(_PlantedSchedule):
    """Planted: the V-shaped schedules' stages placed by the loop (stage s on rank s mod p), not as a V."""

    applies_to = ("zbv", "dualpipev")
    plant = staticmethod(planted_schedules.v_stage_misplaced)


class PrematureOverlap(_PlantedSchedule):
    """Planted: a DualPipeV overlapped pair whose backward reads the activation its own forward computes."""

    applies_to = ("dualpipev",)

    @staticmethod
    def plant(schedule):
        return planted_schedules.premature_overlap(schedule) if schedule.meta.get("overlap") else schedule


class _DoubleCountingRuntime(PipelineRuntime):
    @staticmethod
    def weight_gradients(stage, y, g):
        """Planted: W per layer of the stage, in order: a layer the stage applies twice contributes its (already
        summed) gradient twice."""
        import torch

        out = []
        for layer in stage:  # Sequential's iteration repeats a module used twice
            params = [p for p in layer.parameters() if p.requires_grad]
            out += list(zip(params, torch.autograd.grad(y, params, g, retain_graph=True), strict=True))
        return out


class DoubleCountsSharedWeight(ReferencePipeline):
    """Planted (pytorch #180952's shape): the split backward's W counts a weight used twice in a stage twice."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        return _DoubleCountingRuntime(self.schedule(schedule, num_stages, num_microbatches, virtual_stages,
                                                    batch_size, group), stages, loss_fn, batch_size, sample_shape,
                                      group)
