"""The significance test of the gate: how much slower is NEW than BASELINE, and how sure are we.

For two sets of per-iteration times b (baseline, m samples) and x (new, n samples) the gate estimates
the ratio new / baseline by the Hodges-Lehmann estimator on the log scale,

    r = exp(median over all i, j of (log x_j - log b_i)),

and its distribution-free confidence interval from the Mann-Whitney U statistic: with the m n pairwise
differences D sorted, the interval at confidence c is [D_(k+1), D_(mn-k)] with

    k = floor(m n / 2 - z_{(1+c)/2} sqrt(m n (m + n + 1) / 12))

(the normal approximation of U's null distribution; no tie correction: times are continuous). The test
needs no normality and is unmoved by a few outliers (a descheduled iteration), and on the log scale
the shift is a ratio, which is what "10 % slower" means. A case is flagged only when the whole interval
lies beyond the effect-size threshold: significance alone would flag a 0.5 % change measured with many
samples; the threshold alone would flag noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, median


@dataclass(frozen=True)
class RatioInterval:
    ratio: float
    """Hodges-Lehmann estimate of new / baseline."""
    low: float
    high: float
    """The confidence interval of the ratio; (0, inf) when there are too few samples for the confidence."""
    base_median: float
    new_median: float
    base_n: int
    new_n: int

    def verdict(self, threshold: float) -> str:
        return verdict(self.ratio, self.low, self.high, threshold)


def verdict(ratio: float, low: float, high: float, threshold: float) -> str:
    """``slower`` when the whole interval [low, high] of a ratio is above 1 + threshold, ``faster`` when
    wholly below 1 / (1 + threshold), ``inconclusive`` when the estimate is beyond the threshold but the
    interval is not, else ``unchanged``."""
    if low > 1 + threshold:
        return "slower"
    if high < 1 / (1 + threshold):
        return "faster"
    if ratio > 1 + threshold or ratio < 1 / (1 + threshold):
        return "inconclusive"
    return "unchanged"


def excluded_per_side(m: int, n: int, confidence: float) -> int:
    """k: how many of the m n sorted pairwise differences lie outside the interval on each side."""
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    return math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))


def ratio_interval(base: list[float], new: list[float], confidence: float) -> RatioInterval:
    """The ratio new / baseline of two positive samples, with its confidence interval (see the module)."""
    if not base or not new:
        raise ValueError("both samples must be non-empty")
    if min(base) <= 0 or min(new) <= 0:
        raise ValueError("times must be positive")
    log_b = [math.log(t) for t in base]
    diffs = sorted(math.log(x) - lb for x in new for lb in log_b)
    k = excluded_per_side(len(base), len(new), confidence)
    low, high = (math.exp(diffs[k]), math.exp(diffs[-k - 1])) if k >= 0 else (0.0, math.inf)
    return RatioInterval(math.exp(median(diffs)), low, high, median(base), median(new), len(base), len(new))


# --- Between runs --------------------------------------------------------------------------------------
# On a shared 2-core runner a case's median moves from one process to the next by far more than its
# iterations suggest (measured here: 15 % standard deviation between runs against 3-7 % standard error
# within one; python -m harness.gate.study). Iterations of one run are then not independent draws of
# what the next run will measure, and the interval above is too narrow. Where a side holds several runs
# (a baseline merged from repeats), the gate therefore works on run medians: with m_i = log median of
# baseline run i (k runs) and x_j of new run j (r runs),
#
#     d = mean(x) - mean(m),   s^2 = pooled variance of the m_i and x_j about their own means,
#     interval = d -/+ t_{k + r - 2, (1+c)/2} s sqrt(1/k + 1/r),
#
# a random-effects comparison whose spread is the runner's own run-to-run spread, learned from the
# baseline. With one run on each side there is nothing to learn it from: the iteration-level interval
# is used and the verdict says so.


def _t_pdf(x: float, dof: int) -> float:
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return math.exp(log_c - (dof + 1) / 2 * math.log1p(x * x / dof))


def _t_cdf(x: float, dof: int, steps: int = 2000) -> float:
    """Student's t distribution function by Simpson's rule on [0, |x|] (error far below 1e-6 here)."""
    h = abs(x) / steps
    area = _t_pdf(0, dof) + _t_pdf(abs(x), dof) + sum((4 if i % 2 else 2) * _t_pdf(i * h, dof) for i in range(1, steps))
    half = area * h / 3
    return 0.5 + half if x >= 0 else 0.5 - half


_T_CACHE: dict = {}


def t_quantile(p: float, dof: int) -> float:
    """The p quantile (p > 0.5) of Student's t with ``dof`` degrees of freedom, by bisection."""
    key = (round(p, 12), dof)
    if key not in _T_CACHE:
        lo, hi = 0.0, 1e3
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _t_cdf(mid, dof) < p else (lo, mid)
        _T_CACHE[key] = (lo + hi) / 2
    return _T_CACHE[key]


def mean_shift_interval(base: list[float], new: list[float], confidence: float) -> tuple[float, float, float]:
    """(d, low, high): the difference of means new - base of two sets of log values (run medians, or run
    effects) and its pooled-variance t interval; needs at least three values in all."""
    k, r = len(base), len(new)
    if k < 1 or r < 1 or k + r < 3:
        raise ValueError("needs at least one value per side and three in all")
    mb, mn = sum(base) / k, sum(new) / r
    ss = sum((v - mb) ** 2 for v in base) + sum((v - mn) ** 2 for v in new)
    s = math.sqrt(ss / (k + r - 2))
    half = t_quantile((1 + confidence) / 2, k + r - 2) * s * math.sqrt(1 / k + 1 / r)
    d = mn - mb
    return d, d - half, d + half


def run_interval(base_runs: list[list[float]], new_runs: list[list[float]], confidence: float) -> RatioInterval:
    """The ratio new / baseline of a case measured in several runs (see above): from run medians."""
    mb = [math.log(median(r)) for r in base_runs]
    mn = [math.log(median(r)) for r in new_runs]
    d, lo, hi = mean_shift_interval(mb, mn, confidence)
    pooled_b = [t for r in base_runs for t in r]
    pooled_n = [t for r in new_runs for t in r]
    return RatioInterval(math.exp(d), math.exp(lo), math.exp(hi), median(pooled_b), median(pooled_n),
                         len(pooled_b), len(pooled_n))
