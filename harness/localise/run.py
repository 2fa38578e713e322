"""The trace of the minimal case: every rank traced on a World, the one-device run traced in this process, every
item compared, the first one off its bound found and its shape classified."""

from __future__ import annotations

import re

from harness.errors import describe

from .compare import activations, from_state, local_gradients, losses
from .oracle import one_device_trace
from .shape import classify
from .trace import trace_stack


def traced(loc, worlds, impl: str, case, fixed: dict, seed: int) -> None:
    """Fill ``loc`` (a ``Localisation``) from one traced run of ``case``."""
    from harness.runtime.failures import RankFailure
    from harness.stack.inputs import global_batch

    lay, n = case.layout, case.layout.world_size
    try:
        results = worlds(n).run(trace_stack, impl, case.spec, lay, case.recipe, case.steps, seed, case.padded,
                                fixed["rows"], fixed["seq"], timeout=300)
    except RankFailure as exc:  # a rank raised, died or hung (WorldTimeout) outside the stack's own calls
        loc.notes.append(f"The traced run of the minimal case failed ({describe(exc)}): not localised further.")
        return
    refused = next((r["refused"] for r in results if r["refused"]), None)
    if refused:
        loc.notes.append(f"The traced run was refused ({refused}): not localised further.")
        return
    tokens, targets = global_batch(case.spec.vocab, fixed["rows"], seed, fixed["seq"], case.padded)
    params = any(r["parameters"] for r in results)
    oracle = one_device_trace(case.spec, case.recipe, seed, tokens, targets, case.steps,
                              replicas=lay.dp if params else None)
    items, unmapped = [], set()
    for r in results:
        got, names = activations(r, oracle, lay, case.spec, tokens, n)
        items += got + local_gradients(r, oracle, lay, case.spec, tokens, n)
        items += from_state(r, oracle, case.spec, case.recipe, tokens, n)
        items += losses(r, oracle, case.spec, tokens, n)
        unmapped |= set(names)
    errors = [r["error"] for r in results if r["error"]]
    if not any(r["modules"] for r in results):
        loc.notes.append("The stack exposes no modules (traced_modules) and none were found by their parameters' "
                         "names: localised on its dense state only.")
    elif any(r.get("discovered") for r in results):
        loc.notes.append("Modules found by their parameters' names (the stack gives no traced_modules).")
    for phase, what in (("forward", "outputs"), ("backward", "gradients at the outputs")):
        said = sorted({re.sub(r"\.\d+(?=\.|$)", ".N", name) for p, name in unmapped if p == phase})
        if said:
            loc.notes.append(f"Not compared: the {what} of {', '.join(said)} (no slice of one device's: another shape "
                             "or a partial sum).")
    if errors:
        loc.notes.append(f"The traced run raised: {errors[0]} — what it recorded before is compared.")
    loc.curve = _curve(items)
    off = [i for i in items if i.off]
    if not off:
        loc.notes.append("No traced tensor leaves its bound on the minimal case: the failure is in what is not traced "
                         "(a tensor no module outputs, a state the dense state does not hold).")
        return
    loc.first = min(off, key=lambda i: i.key)
    f = loc.first
    same = [i for i in items if (i.step, i.phase, i.name) == (f.step, f.phase, f.name)]
    loc.shape = classify(same, lay, case.recipe)


def _curve(items) -> list[tuple[str, float, float]]:
    worst: dict = {}
    for i in sorted(items, key=lambda i: i.key):
        label = f"{i.step}:{i.phase}:{i.name}"
        rel, bound = worst.get(label, (0.0, i.bound))
        worst[label] = (max(rel, i.rel), bound)
    return [(label, rel, bound) for label, (rel, bound) in worst.items()]
