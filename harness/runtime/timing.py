"""Timing inside the ranks, and the statistics the driver makes of it (DESIGN.md, "Benchmarks").

Every iteration is timed on every rank, after a barrier (synchronisation happens before the timed
region, never inside it); on CUDA with events and one synchronise at the end. The driver keeps every
sample: per iteration it takes the max across ranks (an operation is done when its slowest rank is),
then reports p50, p95, min, max, mean and the coefficient of variation, and keeps those per-iteration
times (``samples_us``: ``RunDir`` writes them to samples.csv, which the gate's significance test reads).
"""

from __future__ import annotations

import math
import statistics
import time


def time_iterations(step, iters: int, warmup: int, device) -> list[float]:
    """Run ``step()`` ``warmup`` times untimed, then ``iters`` times timed; seconds per iteration."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    samples, events = [], []
    for _ in range(iters):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            events.append((start, end))
        else:
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) * 1e-3 for s, e in events]
    return samples


def summarize(per_rank: list[list[float]]) -> dict:
    """Per-iteration max across ranks, then p50/p95/min/max/mean (microseconds), CV, and the per-iteration
    times themselves in iteration order (``samples_us``)."""
    worst = [max(samples) for samples in zip(*per_rank, strict=True)]
    if not worst:
        return {}
    samples = [t * 1e6 for t in worst]
    us = sorted(samples)
    mean = statistics.fmean(us)
    return {
        "samples_us": samples,
        "time_p50_us": statistics.median(us),
        "time_p95_us": _percentile(us, 95),
        "time_min_us": us[0], "time_max_us": us[-1], "time_mean_us": mean,
        "time_cv": statistics.pstdev(us) / mean if mean > 0 else 0.0}


def median_interval(values: list[float], level: float = 0.90) -> tuple[float, float, float]:
    """Distribution-free confidence interval of the median of independent samples: the order statistics
    [x_(k), x_(n+1-k)] with the largest k whose coverage 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2), is at
    least ``level`` (n = 5: [min, max] at 93.8 %; n = 10: x_(2), x_(9) at 97.9 %). Fewer samples than reach
    ``level`` (n <= 4 at 90 %): [min, max] with the coverage it has. Returns (low, high, coverage)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0.0

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
