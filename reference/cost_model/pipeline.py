"""Pipeline bubble: the idle fraction of a schedule, idle / (ranks * makespan)."""

from __future__ import annotations

from ..pipeline.generators import GENERATORS, INTERLEAVED
from ._checks import choice, whole

SCHEDULES = tuple(GENERATORS)


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Fraction of (p ranks x makespan) that is idle, for m microbatches on p stages.

    With per-microbatch stage costs F (forward) and B (backward = I + W, input and weight gradients):

    - gpipe, 1f1b: (p - 1) / (m + p - 1) — each rank idles (p - 1)(F + B) of a makespan of
      (m + p - 1)(F + B) (Huang et al. 2019; Narayanan et al. 2021, section 2.2). Independent of costs.
    - interleaved (v model chunks per rank, m a multiple of p): (p - 1) / (v m + p - 1) — the bubble
      shrinks by v (Narayanan et al. 2021, section 2.2.2: bubble time (p - 1)(F + B) / v).
    - zb-h1: (p - 1)(F + I - W) / (m (F + I + W) + (p - 1)(F + I - W)) (Qi et al. 2023, "Zero Bubble
      Pipeline Parallelism", section 3), evaluated at F = I = W = 1: (p - 1) / (3 m + p - 1), a third
      of 1F1B's bubble time. The paper assumes m >= p; with fewer microbatches the critical path binds
      instead (the last microbatch's p forwards and p input-backwards, then rank 0's m weight
      gradients after its last I): makespan max(3m + p - 1, 2m + 2p - 1), idle 1 - 3m / makespan.
    - interleaved-zb (v chunks, m a multiple of p): ZB-H1's bubble over v m chunk-microbatches,
      (p - 1) / (3 v m + p - 1) at F = I = W = 1 per stage.
    - zbv (two half-size stages per rank in a V, F = I = W = 1 per stage): each rank works 6m; the only idle
      is the lead-in of p - 1 (the zero-bubble paper's "zero": nothing idle between a rank's first and last
      action), so makespan 6m + p - 1; with m < 2p - 1 the last microbatch's chain (2p forwards, 2p input
      gradients, after rank 0's other forwards) binds: makespan max(6m + p - 1, 4m + 4p - 2).
    - dualpipev (m >= 2p, as DualPipe requires): makespan 6m + 2(p - 1) at F = I = W = 1 with no overlap gain
      (F&B = F + B): rank 0 idles (p - 1)(F&B + B - 3W) = 2(p - 1), DualPipe's table (deepseek-ai/DualPipe,
      README; DeepSeek-V3 report, table 2). Fewer microbatches have no closed form: simulate the schedule.
    """
    choice("schedule", schedule, SCHEDULES)
    whole("p", p)
    whole("m", m)
    whole("v", v)
    if v > 1 and schedule not in INTERLEAVED:
        raise ValueError(f"v (model chunks per rank) applies to the interleaved schedules only; got v={v} "
                         f"with {schedule}.")
    if schedule in INTERLEAVED and m % p:
        raise ValueError(f"{schedule} needs m to be a multiple of p; got m={m}, p={p}.")
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if schedule == "interleaved-zb":
        return (p - 1) / (3 * v * m + p - 1)
    if schedule == "zbv":
        return 1 - 6 * m / max(6 * m + p - 1, 4 * m + 4 * p - 2)
    if schedule == "dualpipev":
        if m < 2 * p:
            raise ValueError(f"dualpipev's closed form needs m >= 2p microbatches (DualPipe's own rule); got m={m}, "
                             f"p={p}: simulate the schedule (reference.pipeline.simulate) for its bubble.")
        return 1 - 6 * m / (6 * m + 2 * (p - 1))
    makespan = max(3 * m + p - 1, 2 * m + 2 * p - 1)
    return 1 - 3 * m / makespan
