"""The gate's significance test: the Hodges-Lehmann ratio and its Mann-Whitney confidence interval."""

from __future__ import annotations

import math
import random

import pytest

from harness.gate.stats import RatioInterval, excluded_per_side, ratio_interval


def test_the_estimate_of_a_pure_scaling_is_exact():
    base = [100.0 + 3 * i for i in range(20)]
    ri = ratio_interval(base, [1.5 * t for t in base], 0.99)
    # every pairwise log difference is log 1.5 + (log b_j - log b_i): symmetric about log 1.5, so the median
    # is log 1.5 up to rounding of the logs (a few ulp)
    assert ri.ratio == pytest.approx(1.5, rel=1e-12)
    assert ri.low < 1.5 < ri.high
    assert ri.base_median == pytest.approx(128.5) and ri.new_median == pytest.approx(1.5 * 128.5)


def test_excluded_per_side_is_the_normal_approximation_of_u():
    # m = n = 20, c = 0.99: z = 2.5758, sd = sqrt(400 * 41 / 12) = 36.97 -> floor(200 - 95.23) = 104
    assert excluded_per_side(20, 20, 0.99) == 104
    assert excluded_per_side(10, 10, 0.95) == 24
    assert excluded_per_side(2, 2, 0.99) < 0


def test_too_few_samples_give_an_unbounded_interval_that_never_flags():
    ri = ratio_interval([100.0, 101.0], [300.0, 310.0], 0.99)
    assert (ri.low, ri.high) == (0.0, math.inf)
    assert ri.verdict(0.10) == "inconclusive"


def test_coverage_of_same_distribution_samples_is_the_confidence():
    """400 seeded pairs of 20-sample sets drawn from one lognormal: the 99 % interval holds 1 in ~99 % of
    them (binomial sd at 400 trials: 0.5 %; the normal approximation of U is slightly narrow at n = 20)."""
    rng = random.Random(7)
    inside = 0
    for _ in range(400):
        b = [rng.lognormvariate(0, 0.1) for _ in range(20)]
        x = [rng.lognormvariate(0, 0.1) for _ in range(20)]
        ri = ratio_interval(b, x, 0.99)
        inside += ri.low <= 1 <= ri.high
    assert 0.97 <= inside / 400 <= 1.0


@pytest.mark.parametrize(("low", "ratio", "high", "verdict"), [
    (1.11, 1.2, 1.3, "slower"), (1.05, 1.2, 1.3, "inconclusive"), (0.95, 1.02, 1.09, "unchanged"),
    (0.7, 0.8, 0.9, "faster"), (0.7, 0.8, 0.95, "inconclusive"), (1.0, 1.05, 1.12, "unchanged")])
def test_a_verdict_needs_the_whole_interval_beyond_the_threshold(low, ratio, high, verdict):
    assert RatioInterval(ratio, low, high, 1.0, ratio, 20, 20).verdict(0.10) == verdict


@pytest.mark.parametrize(("base", "new"), [([], [1.0]), ([1.0], []), ([0.0, 1.0], [1.0]), ([1.0], [-1.0])])
def test_bad_samples_are_refused(base, new):
    with pytest.raises(ValueError):
        ratio_interval(base, new, 0.99)
