"""The findings registry: every known non-conformance of a third-party implementation, in one place.

A finding belongs to the suite, never to the code under test: it names a built-in implementation, the
package and version range it was seen in, the condition (on the case) under which it shows, the reason,
and the watch test that fails once the package changes the behaviour. The suites consult ``match`` for
an example that failed, with the failure's own lines (``evidence``): a finding matches only where its condition
holds the case AND every line of the failure is its ``symptom`` — the same configuration failing for another
reason (an exception the finding does not name, another tensor wrong) stays a failure. A match turns the
failure into ``known-nonconformance`` (pytest: xfail with the
reason; ``pytest --strict``: a failure). Nothing read from an implementation object can excuse a failure
or loosen a bound — a user's implementation (``package.module:object``, an entry point) never matches,
even if it calls itself "torch". Precision-matched bounds (``precision``) come from here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.records.versions import installed as _installed
from harness.records.versions import release as _release


@dataclass(frozen=True)
class Finding:
    impl: str
    """The built-in implementation's registry name."""
    paradigm: str
    package: str
    """The distribution whose version ``versions`` bounds (``torch``, ``megatron-core``, ``deepspeed``)."""
    versions: tuple[str, str | None]
    """[first version seen, first version known fixed) — None: not fixed yet."""
    reason: str
    """What goes wrong, with the minimal case; shown as the xfail reason."""
    watch: str
    """The test that fails when the package changes this behaviour."""
    condition: dict = field(default_factory=dict)
    """Case parameters -> required value, or a callable of the parameter (all must hold)."""
    symptom: str = ""
    """A regular expression every line of a failure must contain (``re.search``) for the finding to explain it:
    what differs and how, or the error raised. Empty: the finding explains no failure (it is watched only)."""
    cause: str = ""
    """Where the symptom also admits the cause's consequences (a missing gradient, then the weights it did not
    move): a regular expression at least one line must contain. Empty: the symptom itself."""
    precision: str | None = None
    """Where the finding is a precision (not a wrong result): the dtype the suite's bound uses."""
    hangs: bool = False
    """Its symptom is a deadlock: each one costs the hang window and a World respawn, so the suites run it once — its
    watch, at the minimal case — and report every other case it applies to as known without running it
    (``known_hang``)."""
    handled_by_adapter: str = ""
    """Non-empty where our built-in adapter never lets the behaviour reach a conformance check (it declares
    the case unsupported, refuses it, or configures the package around it): what the adapter does. Such a
    finding is listed and watched, and excuses nothing."""

    def applies(self, **case) -> bool:
        for key, want in self.condition.items():
            if key not in case:
                return False
            ok = want(case[key]) if callable(want) else case[key] == want
            if not ok:
                return False
        return True

    def explains(self, evidence) -> bool:
        """Every line of ``evidence`` (a failure's lines, or one string) shows this finding's symptom."""
        lines = [evidence] if isinstance(evidence, str) else list(evidence)
        return (bool(self.symptom) and all(re.search(self.symptom, line) for line in lines)
                and any(re.search(self.cause or self.symptom, line) for line in lines))


def not_power_of_two(n: int) -> bool:
    return n & (n - 1) != 0


def findings() -> tuple[Finding, ...]:
    """Every paradigm's findings (``harness/<p>/findings.py``, read through its ``PARADIGM`` record)."""
    from harness.paradigm import paradigms

    return tuple(f for p in paradigms() for f in p.findings)


def __getattr__(name: str):
    if name == "FINDINGS":  # the whole registry, read when asked (the records import this module)
        return findings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _in_range(finding: Finding) -> bool:
    version = _installed(finding.package)
    if version is None:
        return False
    lo, hi = finding.versions
    return _release(lo) <= _release(version) and (hi is None or _release(version) < _release(hi))


def outside_range(watch: str) -> str | None:
    """Why the watch test ``watch`` (its node id) does not apply to what is installed here — its package missing,
    or a release outside the finding's range, where the finding claims nothing — else None. A watch test skips
    with it: a finding of 2.13 is not expected of 2.12, nor excused there."""
    found = [f for f in findings() if f.watch == watch]
    if not found:
        raise KeyError(f"no finding is watched by {watch!r}")
    finding = found[0]
    version = _installed(finding.package)
    if version is None:
        return f"{finding.package} is not installed"
    if _in_range(finding):
        return None
    lo, hi = finding.versions
    return f"{finding.package} {version} is outside this finding's range [{lo}, {hi or 'not fixed'})"


def _builtin(spec: str, paradigm: str) -> str | None:
    """The built-in name ``spec`` stands for (an option of a built-in stack: that stack's, ``registry.OPTIONS``),
    or None for anything else (a user's implementation)."""
    from harness.records.registry import builtins, current_name, options

    spec = current_name(spec)
    return spec if (paradigm, spec) in builtins() else options().get((paradigm, spec))


def _applicable(spec: str, paradigm: str, case: dict) -> list[Finding]:
    """The findings of built-in ``spec`` whose version range holds its installed package and whose
    condition holds ``case``; none for anything but a built-in name."""
    name = _builtin(spec, paradigm)
    return [f for f in findings() if name is not None and f.impl == name and f.paradigm == paradigm
            and _in_range(f) and f.applies(**case)]


def detail_with(finding: Finding | None, detail: str | None) -> str:
    """A conformance row's detail: the finding that explains the row first (where one does), then its own."""
    return " | ".join(filter(None, [f"known finding: {finding.reason}" if finding else None, detail]))


def match(spec: str, paradigm: str, evidence, **case) -> Finding | None:
    """The finding that explains a failed example of ``spec`` under ``case`` whose failure reads ``evidence``
    (its lines), or None (then it is a failure)."""
    return next((f for f in _applicable(spec, paradigm, case)
                 if f.precision is None and not f.handled_by_adapter and f.explains(evidence)), None)


def known_hang(spec: str, paradigm: str, **case) -> Finding | None:
    """The finding that says ``spec`` deadlocks under ``case`` (``Finding.hangs``): the case is not run."""
    return next((f for f in _applicable(spec, paradigm, case) if f.hangs), None)


def precision(spec: str, paradigm: str, **case) -> str | None:
    """The dtype a precision finding says ``spec`` computes in under ``case`` (None: full precision)."""
    return next((f.precision for f in _applicable(spec, paradigm, case) if f.precision), None)
