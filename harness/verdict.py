"""One way to a verdict: what a rank returns, how an exception of the code under test becomes one, and how the
ranks' results reduce to a conformance row's outcome.

Rank side, every case's result is a ``RankResult`` (a dict, so it crosses the World as it is): ``refused`` (the
implementation's one sentence, or None), ``unsupported`` (whether that refusal declares the case unsupported,
rather than refusing a case the contract admits), ``problems`` (one line each; empty: it holds), ``worst`` and
``bound`` (the largest relative difference seen and the bound it was held to), plus the case's own keys.

The ladder from an exception to a verdict (``attempt``): ``NotImplementedError`` (``Unsupported``) — the case is
unsupported, with its sentence; ``ValueError`` (or the case's own refusals) — refused, with its sentence; anything
else — this rank's own failure, the World told at once so that peers still inside the implementation are ended.
The driver's side: ``reduce`` the ranks' results to (outcome, refusal, problems); the suite then turns a failure
a registry finding explains into ``known-nonconformance`` (``harness.records.findings.match``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, TypedDict

import torch

from harness.runtime.rank import failed_in_implementation

from .errors import describe

U64 = 2.0**-53
"""float64's unit roundoff: every structural bound is a count of roundings times it."""


class RankResult(TypedDict, total=False):
    refused: str | None
    unsupported: bool
    problems: list[str]
    worst: float
    bound: float


def refusal(sentence: str, unsupported: bool = False, **extra) -> RankResult:
    """The implementation declined the case in one sentence: unsupported, or refused (a case it may refuse)."""
    return {"refused": sentence, "unsupported": unsupported, "problems": [], **extra}


def checked(problems: list[str], worst: float = 0.0, bound: float = math.nan, **extra) -> RankResult:
    """The case ran on this rank and was compared: ``problems`` (empty: it holds)."""
    return {"refused": None, "unsupported": False, "problems": problems, "worst": worst, "bound": bound, **extra}


def failed(detail: str, worst: float = math.inf, **extra) -> RankResult:
    """A rank's result where the implementation failed (its own exception, or the World's verdict of a call that
    failed: ``harness.runtime.world.run_or_fail``'s ``failed``)."""
    return checked([detail], worst=worst, **extra)


def failed_here(detail: str, **extra) -> RankResult:
    """This rank caught the implementation's exception: tell the World (peers inside it are ended), fail."""
    failed_in_implementation(detail)
    return failed(detail, **extra)


def refused_by(exc: BaseException, refusals: tuple = (ValueError,), **extra) -> RankResult | None:
    """The ladder's first two rungs: ``exc`` as an unsupported case or a refusal, or None (a failure)."""
    if isinstance(exc, NotImplementedError):
        return refusal(str(exc), unsupported=True, **extra)
    if isinstance(exc, refusals):
        return refusal(str(exc), **extra)
    return None


def attempt(what: str, call, *args, refusals: tuple = (ValueError,), rank: int | None = None, **extra):
    """``(call(*args), None)``, or ``(None, the verdict of its exception)`` by the ladder: unsupported, refused,
    or this rank's failure "rank r: <what> raised <exception>" (``extra``: keys every result of the case has)."""
    try:
        return call(*args), None
    except Exception as exc:  # noqa: BLE001 - whatever the code under test raises is a verdict
        verdict = refused_by(exc, refusals, **extra)
        if verdict is not None:
            return None, verdict
        where = "" if rank is None else f"rank {rank}: "
        return None, failed_here(f"{where}{what} raised {describe(exc)}", **extra)


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


def compared(checks, limit: float, rank: int) -> tuple[float, list[str]]:
    """(worst, problem lines "rank r: ...") of (what, got, want) triples each held to ``limit`` by ``off``; a
    tensor the implementation did not give (None) is missing."""
    worst, problems = 0.0, []
    for what, got, want in checks:
        if got is None:
            problems.append(f"rank {rank}: {what}: missing")
            continue
        rel, lines = off(what, got, want, limit)
        worst, problems = max(worst, rel), problems + [f"rank {rank}: {p}" for p in lines]
    return worst, problems


class Verdict(NamedTuple):
    outcome: str
    """pass / fail / unsupported / refused (a failure a finding explains is the suite's to rename)."""
    refused: str | None
    problems: list[str]
    """Every rank's problem lines, each once, sorted (a line names its rank)."""

    @property
    def detail(self) -> str:
        """A conformance row's detail: the refusal, or the first problem."""
        return self.refused or " | ".join(self.problems[:1])


def reduce(per_rank: list[dict]) -> Verdict:
    """Every rank's result to one verdict: unsupported / refused where a rank refused (the first such rank's
    sentence), else fail where any rank has a problem, else pass."""
    first = next((r for r in per_rank if r.get("refused")), None)
    problems = sorted({p for r in per_rank for p in r.get("problems", [])})
    if first is not None:
        return Verdict("unsupported" if first.get("unsupported") else "refused", first["refused"], problems)
    return Verdict("fail" if problems else "pass", None, problems)


def worst(per_rank: list[dict]) -> float:
    """The largest relative difference any rank saw (a conformance row's ``max_rel_err``)."""
    return max((r.get("worst", 0.0) for r in per_rank), default=0.0)
