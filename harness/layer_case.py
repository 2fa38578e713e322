"""What the layer-level cases (context parallel, expert parallel) share on the rank side: one tensor held to
one device's (a rank's result: ``harness.verdict``)."""

from __future__ import annotations

import math

import torch


def off(what: str, got, want, limit: float) -> tuple[float, list[str]]:
    """(|got - want| / want's largest magnitude, a line if beyond ``limit``): a missing or misshapen tensor,
    or a NaN / inf where one device is finite, is off by inf."""
    if not torch.is_tensor(got) or tuple(got.shape) != tuple(want.shape):
        return math.inf, [f"{what}: shape {tuple(getattr(got, 'shape', ()))} != {tuple(want.shape)}"]
    mag = max(float(want.abs().max()), 1e-300)
    rel = float((got.detach().to(want.dtype) - want).abs().max()) / mag
    if rel != rel:
        return math.inf, [f"{what}: NaN or inf where one device is finite"]
    return rel, ([f"{what}: off by {rel:.3g} of its magnitude > {limit:.3g}"] if not rel <= limit else [])
