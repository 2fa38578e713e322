"""Least-squares fits of the α–β (Hockney) model to measured times.

A collective on g ranks of a buffer of S bytes takes steps(op, g) α + volume(op, g, S) β on the ring
algorithm (``reference.cost_model.alpha_beta_time``): linear in (α, β), so the fit is a two-column
least squares. Both must be non-negative; where the unconstrained optimum has a negative one the
constrained optimum lies on that axis (the other fitted alone). Points are weighted by 1 / t: the fit
minimises the relative error, so microsecond latencies count as much as millisecond transfers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    alpha: float
    """Seconds per step (latency)."""
    beta: float
    """Seconds per byte."""
    median_rel_error: float
    max_rel_error: float
    points: int


def fit_linear(x1: list[float], x2: list[float], t: list[float]) -> Fit:
    """Non-negative (a, b) minimising sum(((a x1 + b x2) - t) / t)^2."""
    if len(t) < 2 or len(x1) != len(t) or len(x2) != len(t):
        raise ValueError(f"an α–β fit needs at least two points of equal length; got {len(t)}.")
    if any(not (v > 0 and math.isfinite(v)) for v in t):
        raise ValueError("every time of an α–β fit must be positive and finite.")
    w = [1.0 / v for v in t]
    a1 = [u * wi for u, wi in zip(x1, w, strict=True)]
    a2 = [u * wi for u, wi in zip(x2, w, strict=True)]
    s11, s22, s12 = sum(u * u for u in a1), sum(u * u for u in a2), sum(u * v for u, v in zip(a1, a2, strict=True))
    r1, r2 = sum(a1), sum(a2)  # the weighted targets t / t are all 1
    det = s11 * s22 - s12 * s12
    candidates = []
    if det > 1e-300 * max(s11 * s22, 1e-300):
        a, b = (r1 * s22 - r2 * s12) / det, (r2 * s11 - r1 * s12) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))
    candidates += [(r1 / s11 if s11 else 0.0, 0.0), (0.0, r2 / s22 if s22 else 0.0)]
    best = min(candidates, key=lambda ab: _sse(ab, x1, x2, t))
    errors = sorted(abs(best[0] * u + best[1] * v - ti) / ti for u, v, ti in zip(x1, x2, t, strict=True))
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return Fit(max(best[0], 0.0), max(best[1], 0.0), median, errors[-1], len(t))


def _sse(ab, x1, x2, t) -> float:
    return sum(((ab[0] * u + ab[1] * v) - ti) ** 2 / ti ** 2 for u, v, ti in zip(x1, x2, t, strict=True))


def collective_terms(op: str, g: int, size: float) -> tuple[float, float]:
    """(steps, bytes on the critical path) of the ring algorithm: time = steps α + bytes β."""
    from reference.cost_model import alpha_beta_time

    return alpha_beta_time(op, g, size, 1.0, 0.0), alpha_beta_time(op, g, size, 0.0, 1.0)


def fit_collective(op: str, g: int, sizes: list[float], times: list[float]) -> Fit:
    terms = [collective_terms(op, g, s) for s in sizes]
    return fit_linear([a for a, _ in terms], [b for _, b in terms], times)


def fit_message(sizes: list[float], times: list[float]) -> Fit:
    """One point-to-point message: t = α + S β."""
    return fit_linear([1.0] * len(sizes), list(sizes), times)
