"""Rank-side helpers for the pipeline findings (module-level, so a World can call them)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def torch_uneven_microbatches(batch: int, m: int) -> None:
    """Run torch's ScheduleGPipe with ``batch`` rows in ``m`` microbatches on the rank's device (whatever it raises,
    raises)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from harness.runtime.rank import rank_device

    device = rank_device()
    stage = PipelineStage(torch.nn.Linear(2, 2, dtype=torch.float64, device=device), dist.get_rank(),
                          dist.get_world_size(), device)
    sched = ScheduleGPipe(stage, m, loss_fn=lambda out, t: ((out - t) ** 2).sum(), scale_grads=False)
    x = torch.zeros(batch, 2, dtype=torch.float64, device=device)
    last = dist.get_rank() == dist.get_world_size() - 1
    sched.step(*((x,) if dist.get_rank() == 0 else ()), **({"target": x} if last else {}))
