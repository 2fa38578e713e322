"""The findings registry is the suite's: only built-in implementations in the recorded version range,
under the recorded condition, match; no implementation attribute can excuse a failure or loosen a bound;
a known finding shows as xfail, and as a failure under ``pytest --strict``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import findings
from harness.findings import FINDINGS, Finding
from harness.pytest_plugin import Conformance

ROOT = Path(__file__).resolve().parents[2]


def _installed(finding: Finding) -> bool:
    return findings._in_range(finding)


def test_each_finding_has_a_watch_test_that_exists():
    for f in FINDINGS:
        path, _, name = f.watch.partition("::")
        assert (ROOT / path).is_file() and f"def {name}(" in (ROOT / path).read_text(), f.watch
        assert f.reason.endswith(".") and "\n" not in f.reason


def test_a_users_implementation_never_matches_a_finding():
    """A user's object is matched by nothing, whatever it is called or declares."""
    for spec in ("mypkg.tp:Torch", "harness.adapters.torch_tensor_parallel:TorchTensorParallel", "reference"):
        assert findings.match(spec, "tensor_parallel", row_bias=True, n=3, kind="row") is None
        assert findings.precision(spec, "tensor_parallel", kind="lm_head") is None


def test_builtin_matches_only_under_its_condition():
    if not _installed(FINDINGS[0]):
        pytest.skip("torch outside the finding's version range")
    assert findings.match("torch", "tensor_parallel", row_bias=True, n=3, kind="row") is FINDINGS[0]
    assert findings.match("torch", "tensor_parallel", row_bias=True, n=4, kind="row") is None
    assert findings.match("torch", "tensor_parallel", row_bias=False, n=3, kind="row") is None
    assert findings.match("torch", "tensor_parallel", kind="row") is None  # condition keys missing: no match
    assert findings.match("torch", "zero", row_bias=True, n=3) is None


def test_version_range_is_honoured(monkeypatch):
    monkeypatch.setattr(findings, "_installed", lambda package: "2.13.0+cpu")
    assert findings._in_range(Finding("torch", "x", "torch", ("2.6", None), "r.", "w"))
    assert findings._in_range(Finding("torch", "x", "torch", ("2.13", "2.14"), "r.", "w"))
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.6", "2.13"), "r.", "w"))
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.14", None), "r.", "w"))
    monkeypatch.setattr(findings, "_installed", lambda package: None)
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.6", None), "r.", "w"))


def test_no_implementation_attribute_is_read_to_excuse_or_loosen():
    pattern = re.compile(r"known_nonconformance|cross_entropy_dtype")
    offenders = [str(p.relative_to(ROOT)) for d in ("harness", "suites", "reference") for p in (ROOT / d).rglob("*.py")
                 if pattern.search(p.read_text()) and p.name != "test_findings_registry.py"]
    assert not offenders, offenders


@pytest.mark.parametrize("strict", [False, True])
def test_known_findings_xfail_and_fail_under_strict(strict):
    finding = FINDINGS[0]
    conformance = Conformance(None, "p", strict=strict)
    conformance.record("pass")
    conformance.settle()  # nothing known: nothing happens
    conformance.record("known-nonconformance", finding=finding)
    expected = pytest.fail.Exception if strict else pytest.xfail.Exception
    with pytest.raises(expected, match="1 example\\(s\\) hit a known finding"):
        conformance.settle()


def test_findings_the_adapters_handle_excuse_nothing():
    handled = [f for f in FINDINGS if f.handled_by_adapter]
    assert len(handled) == 6 and all(not f.condition for f in handled)
    for f in handled:  # no condition to meet, yet a handled finding never matches a failure
        assert findings.match(f.impl, f.paradigm, kind="row", n=3, row_bias=False) not in handled
