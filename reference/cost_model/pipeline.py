"""Pipeline bubble: the idle fraction of a schedule, idle / (ranks * makespan)."""

from __future__ import annotations

from ..pipeline.generators import GENERATORS
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
    """
    choice("schedule", schedule, SCHEDULES)
    whole("p", p)
    whole("m", m)
    whole("v", v)
    if v > 1 and schedule != "interleaved":
        raise ValueError(f"v (model chunks per rank) applies to the interleaved schedule only; got v={v} "
                         f"with {schedule}.")
    if schedule == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B needs m to be a multiple of p; got m={m}, p={p}.")
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    makespan = max(3 * m + p - 1, 2 * m + 2 * p - 1)
    return 1 - 3 * m / makespan
