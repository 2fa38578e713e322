"""A Muon recipe's slack in the stack case: torch's Muon orthogonalises each matrix's update in bfloat16 (Newton-
Schulz), so a parallel run whose gradients differ from one device's by float32 / float64 rounding may round the
iteration differently — by the bfloat16 iteration's own error, not the spec dtype's. Each tensor's difference, in
Frobenius norm, is held within the case's bound (``harness.stack.case.bound``) x its magnitude x sqrt(its elements)
plus ``ratio`` x E_T, E_T the Frobenius distance between one device with torch's Muon and one device with the
iteration in float64 (``OptimizerSpec.ns_dtype``): the two sources add (triangle inequality), and the parallel run's
bfloat16 iteration is as far from exact as one device's up to the extra roundings of the matmuls its ranks split —
``ratio``, the Muon suite's argument. The gradient norm (steps after the first see the updated weights) and the loss
the same way: ratio x |g - g_exact| and ratio x |loss - loss_exact|.

The spec dtype's own rounding of the gradients (float32: ~1e-7; float64: ~1e-16) is far below bfloat16's (2^-9): it
changes the iteration's input only where an element sits on a bfloat16 rounding boundary. A float64 spec keeps the
first term (the case's bound) negligible, so the iteration's slack alone decides — the Muon cases are float64."""

from __future__ import annotations

import math
from dataclasses import replace

from .inputs import flat_state


def ratio(layout) -> float:
    """How far the parallel run's Muon may be from one device's, in units of E_T: one device's iteration rounds once
    per operation; an implementation may split each Newton-Schulz matmul over the ranks holding a part of the matrix
    (``s``: tp, times dp x cp where ZeRO 2-3 / FSDP shards the parameters) — each part's partial sums rounded, then
    their reduction (2 s more roundings, DTensor's way). Independent roundings add in quadrature (Higham & Mary), and
    the norm fluctuates by up to 2x around its typical value (the suite's margin for a tensor's maximum, kept):
    |parallel - exact| <= 2 sqrt(1 + 2 s) E_T, so 1 + 2 sqrt(1 + 2 s) — 4.5 unsplit, 5.5 at tp 2, 7 at FSDP 2 x tp 2.
    (A Newton-Schulz of a rank's rows is 2-12 E_T off after step 1, 37-176 E_T in the optimizer state after step 2:
    ``suites/stack/test_muon.py``.)"""
    s = layout.tp * (layout.dp * layout.cp if layout.zero >= 2 else 1)
    return 1 + 2 * math.sqrt(1 + 2 * s)


def _apart(a: dict, b: dict, r: float) -> dict:
    return {n: (float((a[n] - b[n]).norm()), r) for n in a}


def muon_slacks(want: list, exact: list, layout) -> list[dict]:
    """Per step of one device's records ``want`` (torch's Muon) and ``exact`` (the iteration in float64), each slack
    as (E_T, ratio): {"parameter": {name: slack}, "optimizer state": {"name/key": slack}, "norm": slack (E_T: |g -
    g_exact|), "loss": slack}."""
    r = ratio(layout)
    out = []
    for w, e in zip(want, exact, strict=True):
        moved = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(w["grads"], e["grads"], strict=True)))
        out.append({"parameter": _apart(w["params"], e["params"], r),
                    "optimizer state": _apart(flat_state(w["optimizer"]), flat_state(e["optimizer"]), r),
                    "norm": (moved, r), "loss": (abs(w["loss"] - e["loss"]), r)})
    return out


def exact_recipe(recipe):
    """``recipe`` with Muon's Newton-Schulz in float64."""
    return replace(recipe, optimizer=replace(recipe.optimizer, ns_dtype="float64"))
