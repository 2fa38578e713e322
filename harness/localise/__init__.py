"""Where and why a stack case fails: its minimal failing configuration (``shrink``), the first tensor that leaves
its bound on that configuration (``trace`` on every rank, ``oracle`` on one device, ``compare`` mapping each shard
onto the one-device tensor it is part of), and the shape of the difference (``shape``). Runs only on a failure."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .shrink import FAILS, Case, Shrunk, describe, shrink

__all__ = ["Case", "Localisation", "describe", "localise", "shrink", "trace_only"]

PHASE_WORDS = {"forward": "forward output of {}", "backward": "gradient at the output of {}",
               "local gradient": "gradient of {} before the data-parallel reduction",
               "reduced gradient": "gradient of {} after the reduction", "gradient norm": "{}",
               "clipped gradient": "gradient of {} after clipping", "update": "update of {}",
               "loss": "loss the step returned"}
LOW = ("bfloat16", "float16")


@dataclass
class Localisation:
    shrunk: Shrunk
    first: object | None = None
    """The first diverging ``compare.Item`` (None: nothing traced leaves its bound, or nothing was traced)."""
    shape: tuple[str, str] = ("", "")
    """(the rule, the sentence) of ``shape.classify``."""
    notes: list[str] = field(default_factory=list)
    curve: list[tuple[str, float, float]] = field(default_factory=list)
    """(tensor, worst error relative to its magnitude, bound) in execution order: what the plot draws."""
    seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [self.shrunk.line()]
        if self.first is not None:
            i = self.first
            where = PHASE_WORDS[i.phase].format(i.name)
            mb = f", call {i.call}" if i.phase in ("forward", "backward") else ""
            out.append(f"First diverging: the {where} at step {i.step}, on rank {i.rank}{mb}: off by {i.rel:.3g} of "
                       f"its magnitude > its bound {i.bound:.3g}.")
            out.append(f"Shape: {self.shape[1]}.")
        return out + self.notes


def _outcome(worlds, impl, fixed, judged):
    def verdict(case: Case) -> tuple[str, list[str]]:
        kw = {} if case.spec.dtype in LOW else fixed
        v = judged(worlds(case.layout.world_size), impl, case.spec, case.layout, case.recipe, one=lambda: worlds(1),
                   steps=case.steps, padded=case.padded, **kw)
        return v["outcome"], v["problems"]
    return verdict


def _fixed(case: Case) -> dict:
    """The case's global batch, kept for every smaller case and the trace: its rows and sequence length (every
    smaller layout splits them)."""
    from harness.stack.inputs import rows_for, seq_for

    return {"rows": rows_for(case.layout, case.recipe), "seq": seq_for(case.layout)}


def localise(worlds, impl: str, case: Case, judged, problems: list[str] | None = None, budget: int = 24,
             seed: int = 0) -> Localisation:
    """The localisation of ``impl``'s failing ``case`` (``worlds(n)``: a World of n ranks — the session's cache;
    ``judged``: ``harness.stack.judge.judged``, the verdict each smaller case gets; ``problems``: the case's own
    verdict's, or None to run it once more): shrunk within ``budget`` extra World calls, then traced once on the
    minimal case."""
    start = time.monotonic()
    fixed = _fixed(case)
    verdict = _outcome(worlds, impl, fixed, judged)
    if problems is None:
        outcome, problems = verdict(case)
        if outcome not in FAILS:
            return Localisation(Shrunk(case, case, calls=1), notes=[f"The case does not fail ({outcome}): nothing to "
                                                                   "localise."])
    shrunk = shrink(verdict, case, problems, budget)
    loc = Localisation(shrunk)
    m = shrunk.minimal
    if m.spec.dtype in LOW:
        loc.notes.append(f"The minimal case fails in {m.spec.dtype} only: its tensors are not traced (their bounds are "
                         "the precision-matched E_T of harness.stack.mixed, per parameter): see the problems below.")
    else:
        from .run import traced

        traced(loc, worlds, impl, m, fixed, seed)
    loc.seconds = time.monotonic() - start
    return loc


def trace_only(worlds, impl: str, case: Case, seed: int = 0) -> Localisation:
    """``case`` traced as it is, no shrinking: what the localisation compares, on a case that may pass (then no
    tensor may leave its bound: ``suites/stack/test_localise.py``)."""
    from .run import traced

    loc = Localisation(Shrunk(case, case))
    traced(loc, worlds, impl, case, _fixed(case), seed)
    return loc
