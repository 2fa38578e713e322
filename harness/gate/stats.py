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
        """``slower`` when the whole interval is above 1 + threshold, ``faster`` when wholly below
        1 / (1 + threshold), ``inconclusive`` when the estimate is beyond the threshold but the interval is
        not, else ``unchanged``."""
        if self.low > 1 + threshold:
            return "slower"
        if self.high < 1 / (1 + threshold):
            return "faster"
        if self.ratio > 1 + threshold or self.ratio < 1 / (1 + threshold):
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
