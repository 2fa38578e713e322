"""The minimal failing configuration of a stack case: hypothesis's shrinking, for a whole trainer.

From a failing case the search tries the smaller cases it implies, one removal each — a parallel dimension
dropped to 1 (or halved), ZeRO stage 0, the 1F1B schedule, one step, no accumulation, no clipping, no
checkpointing, no tie, no dropout, a full batch, float64 — on the same global batch (the original case's rows and
sequence: every smaller layout splits them), and keeps the first removal after which the case still fails; it
starts again from there until no removal keeps it failing, or the budget of World calls is spent. A removal that
let the case pass is not tried again from a smaller case (what a bug needs stays needed); at the end the removals
that passed are tried once more on the minimal case itself, so that "passes with tp 1" is said of it. A removal
the stack refuses or does not provide tells nothing and is skipped."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass, field

FAILS = ("fail", "known-nonconformance")
RAISED = re.compile(r" raised |Error: |Exception: |still inside|timed out|died")


def kind(problems) -> str:
    """"raised" (a rank's exception, a hang, a death) or "values" (tensors off their bounds): a smaller case counts
    as still failing only with the original's kind — a planted sum that crashes at tp 1 is not the bug shrunk."""
    return "raised" if any(RAISED.search(p) for p in problems) else "values"


@dataclass(frozen=True)
class Case:
    spec: object
    layout: object
    recipe: object
    steps: int = 2
    padded: bool = False


def _layout(layout, **changes):
    fields = {f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}
    fields.update(changes)
    if fields["pp"] == 1:
        fields["schedule"] = "1f1b"
    if fields["tp"] == 1:  # sequence parallelism is tensor parallelism's: at tp 1 there is none
        fields["sequence_parallel"] = False
    if (fields["dp"] * fields["cp"]) % fields["ep"]:
        fields["ep"] = math.gcd(fields["ep"], fields["dp"] * fields["cp"])
    return type(layout)(**fields)


def _dims(case):
    lay = case.layout
    for name in ("dp", "pp", "cp", "ep", "tp"):
        value = getattr(lay, name)
        for to in sorted({1, value // 2} - {value}):
            if value > 1 and to >= 1:
                yield f"{name} {to}", {name: to}


def smaller(case: Case) -> list[tuple[str, Case]]:
    """(what was removed, the smaller case) for every one-step reduction of ``case``, most ranks saved first."""
    spec, lay, rec = case.spec, case.layout, case.recipe
    out = []
    for label, change in _dims(case):
        out.append((label, {"layout": change}))
    if lay.zero:
        out.append(("ZeRO 0", {"layout": {"zero": 0}}))
    if lay.pp > 1 and lay.schedule != "1f1b":
        out.append(("1F1B", {"layout": {"schedule": "1f1b"}}))
    if case.steps > 1:
        out.append(("one step", {"steps": 1}))
    if rec.accumulation > 1:
        out.append(("no accumulation", {"recipe": {"accumulation": 1}}))
    if rec.max_grad_norm is not None:
        out.append(("no clipping", {"recipe": {"max_grad_norm": None}}))
    if lay.checkpointing:
        out.append(("no checkpointing", {"layout": {"checkpointing": False}}))
    if lay.sequence_parallel:
        out.append(("no sequence parallelism", {"layout": {"sequence_parallel": False}}))
    if getattr(spec, "tie_embeddings", False):
        out.append(("no tie", {"spec": {"tie_embeddings": False}}))
    if getattr(spec, "dropout", 0):
        out.append(("no dropout", {"spec": {"dropout": 0.0}}))
    if case.padded:
        out.append(("a full batch", {"padded": False}))
    if spec.dtype != "float64":
        out.append(("float64", {"spec": {"dtype": "float64"}, "recipe": {"loss_scale": None}}))
    cases = []
    for label, change in out:
        try:
            cases.append((label, _apply(case, change)))
        except ValueError:  # a layout the contract cannot express (ep that divides nothing): not a candidate
            continue
    return cases


def _apply(case: Case, change: dict) -> Case:
    spec = type(case.spec)(**{**case.spec.as_dict(), **change.get("spec", {})})
    layout = _layout(case.layout, **change.get("layout", {}))
    recipe = dataclasses.replace(case.recipe, **change.get("recipe", {}))
    return Case(spec, layout, recipe, change.get("steps", case.steps), change.get("padded", case.padded))


def describe(case: Case) -> str:
    """The case in words, its non-trivial parts only: "dp 2 x tp 2, ZeRO 1, clipping, 2 steps"."""
    lay, rec, spec = case.layout, case.recipe, case.spec
    dims = [f"{n} {getattr(lay, n)}" for n in ("dp", "pp", "cp", "ep", "tp") if getattr(lay, n) > 1]
    parts = [" x ".join(dims) or "one rank"]
    parts += [f"ZeRO {lay.zero}"] if lay.zero else []
    parts += [lay.schedule] if lay.pp > 1 and lay.schedule != "1f1b" else []
    parts += ["checkpointing"] if lay.checkpointing else []
    parts += ["sequence parallelism"] if lay.sequence_parallel else []
    parts += [f"accumulation {rec.accumulation}"] if rec.accumulation > 1 else []
    parts += [f"clipping at {rec.max_grad_norm:g}"] if rec.max_grad_norm is not None else []
    parts += ["tied embedding"] if getattr(spec, "tie_embeddings", False) else []
    parts += [f"dropout {spec.dropout:g}"] if getattr(spec, "dropout", 0) else []
    parts += ["padded batch"] if case.padded else []
    parts += [spec.dtype] if spec.dtype != "float64" else []
    parts += ["one step" if case.steps == 1 else f"{case.steps} steps"]
    return ", ".join(parts)


@dataclass
class Shrunk:
    original: Case
    minimal: Case
    removed: list[str] = field(default_factory=list)
    """The removals kept, in order."""
    passes_with: list[str] = field(default_factory=list)
    """Removals after which the minimal case passes (tried on it)."""
    unknown: list[str] = field(default_factory=list)
    """Removals the stack refused or does not provide, or that the budget left untried on the minimal case."""
    calls: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        head = f"Fails at {describe(self.original)}"
        if self.minimal == self.original:
            head += " — no smaller case fails"
        else:
            head += f"; minimal: {describe(self.minimal)}"
        if self.passes_with:
            head += f" — passes with {', with '.join(self.passes_with)}"
        return head + f" ({self.calls} extra World calls, {self.seconds:.1f} s)."


def shrink(verdict, case: Case, problems: list[str], budget: int = 24) -> Shrunk:
    """``verdict(case)`` -> (outcome, problems) of a case; ``case`` fails with ``problems``. A smaller case still
    fails when its outcome is a fail of the same ``kind``; a fail of another kind is neither (it tells nothing)."""
    want = kind(problems)

    def outcome(c):
        got, said = verdict(c)
        return got if got not in FAILS or kind(said) == want else "another failure"

    start = time.monotonic()
    current, shrunk, passed = case, Shrunk(case, case), {}
    tried: dict = {}

    def run(c):
        if c not in tried:
            shrunk.calls += 1
            tried[c] = outcome(c)
        return tried[c]

    progress = True
    while progress and shrunk.calls < budget:
        progress = False
        for label, candidate in smaller(current):
            if label in passed or shrunk.calls >= budget:
                continue
            got = run(candidate)
            if got in FAILS:
                current, progress = candidate, True
                shrunk.removed.append(label)
                break
            if got == "pass":
                passed[label] = candidate
    shrunk.minimal = current
    for label, candidate in smaller(current):
        if candidate in tried or shrunk.calls < budget:
            got = run(candidate)
            (shrunk.passes_with if got == "pass" else shrunk.unknown if got not in FAILS else []).append(label)
        else:
            shrunk.unknown.append(label)
    shrunk.seconds = time.monotonic() - start
    return shrunk
