"""The ``torch`` pipeline: torch.distributed.pipelining's schedules over PipelineStage.

Held to the same contract as ours, with ``scale_grads=False``: the contract's loss is sum-reduced, and
torch's default (scale_grads=True) divides every gradient by the number of microbatches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.runtime.world import rank_device

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
             "zb-h1": "ScheduleInterleavedZeroBubble", "interleaved-zb": "ScheduleInterleavedZeroBubble",
             "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
SINGLE = ("gpipe", "1f1b")
"""torch's single-stage schedules; the rest take this rank's list of stages (the V-shaped ones place them as a V:
stage r and 2p - 1 - r on rank r, as ``reference.pipeline.placement`` does)."""


class _Step:
    def __init__(self, schedule, has_first: bool, has_last: bool):
        self.schedule, self.has_first, self.has_last = schedule, has_first, has_last

    def step(self, inputs, targets):
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.has_last else {}
        self.schedule.step(*((inputs,) if self.has_first else ()), **kwargs)
        return torch.stack([loss.detach() for loss in losses]).sum() if self.has_last else None


class TorchPipeline:
    """torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B (one stage per rank),
    ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble (stages rank, rank + p, ...), ScheduleZBVZeroBubble
    and ScheduleDualPipeV (stages rank and 2p - 1 - rank)."""

    scale_grads = False  # the contract's loss is a sum

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        from torch.distributed import pipelining

        from harness.contracts import Unsupported

        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}.")
        p = dist.get_world_size(group)
        if schedule in SINGLE and virtual_stages != 1:
            raise Unsupported(f"torch's {SCHEDULES[schedule]} runs one stage per rank.")
        if getattr(pipelining, SCHEDULES[schedule], None) is None:
            raise Unsupported(f"this torch ({torch.__version__}) has no {SCHEDULES[schedule]}.")
        if batch_size % num_microbatches:
            # Found by this suite (torch 2.13, gloo): with unequal microbatches the last stage raises
            # "The size of tensor a (4) must match the size of tensor b (3)"; minimal case p=2, m=2,
            # batch 7. suites/pipeline/test_findings.py keeps the raw behaviour under watch.
            raise Unsupported(f"torch.distributed.pipelining fails on unequal microbatches "
                              f"(batch {batch_size} into {num_microbatches}).")
        device = rank_device()
        pstages = [pipelining.PipelineStage(mod, idx, num_stages, device, group=group)
                   for idx, mod in sorted(stages.items())]
        cls = getattr(pipelining, SCHEDULES[schedule])
        target = pstages[0] if schedule in SINGLE else pstages
        try:
            built = cls(target, num_microbatches, loss_fn=loss_fn, scale_grads=self.scale_grads)
        except (ValueError, AssertionError, NotImplementedError) as exc:
            raise Unsupported(f"torch {SCHEDULES[schedule]} rejects p={p}, m={num_microbatches}, "
                              f"v={virtual_stages}: {exc}") from exc
        return _Step(built, 0 in stages, num_stages - 1 in stages)
