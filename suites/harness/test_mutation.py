"""The mutation runner (suites/mutation.py) tells a caught bug from a correct implementation. The whole
planted set runs in CI after the tests (.ci/run: python -m suites.mutation), not here: it takes minutes."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from suites import mutation

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

def test_runner_flags_a_planted_bug_and_not_a_correct_implementation(monkeypatch):
    """In one pytest process (``PARITYBENCH_WORKERS=0``: two xdist workers' start-ups were half of this test's 19 s
    in tox). The runner on xdist's workers — their junit reports merged into the one it reads — is what CI's
    mutation step runs on the whole table: a merge that lost the failures would leave every plant uncaught there."""
    monkeypatch.setenv("PARITYBENCH_WORKERS", "0")
    tests = "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"
    caught = mutation.run([("suites.collectives.impls:IgnoresSrc", "broadcast from rank 0", tests),
                           ("suites.collectives.impls:ring_unpipelined", "correct", tests)],
                          extra_args=("-k", "broadcast", "--world-sizes", "2,3", *mutation.workers()))
    assert caught["suites.collectives.impls:IgnoresSrc"] == [
        "test_collective_matches_exact_oracle[suites.collectives.impls:IgnoresSrc-broadcast]"], caught
    assert caught["suites.collectives.impls:ring_unpipelined"] == [], caught


def test_workers_are_read_as_tox_reads_them_and_a_bad_count_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("PARITYBENCH_WORKERS", "2")
    assert mutation.workers() == ("-n", "2", "--dist", "loadfile")
    monkeypatch.setenv("PARITYBENCH_WORKERS", "0")
    assert mutation.workers() == ()
    monkeypatch.delenv("PARITYBENCH_WORKERS")
    assert mutation.workers() == ("-n", "2", "--dist", "loadfile")
    monkeypatch.setenv("PARITYBENCH_WORKERS", "two")
    with pytest.raises(SystemExit) as exit_:
        mutation.workers()
    assert exit_.value.code == 2 and "'two' is not a number of workers" in capsys.readouterr().err


# Planted classes held by a test of their own rather than by the mutation table: what they plant is not a wrong
# value a conformance property flags but a raise, a refusal or a localisation (the test named checks that).
HELD_ELSEWHERE = {
    "suites.collectives.impls:AcceptsIntegerAvg": "suites/collectives/test_bad_input.py",
    "suites.pipeline.impls:LastStageRaises": "suites/pipeline/test_planted_bugs.py",
    "suites.tensor_parallel.planted:LastRankRaisesInForward": "suites/tensor_parallel/test_conformance.py",
    "suites.zero.planted:LastRankStepRaises": "suites/zero/test_conformance.py",
    "suites.stack.planted_shapes:TorchLossNotDividedByAccumulation": "suites/stack/test_localise.py",
    "suites.stack.planted_shapes:TitanNormsSummedOverTp": "suites/stack/test_localise.py",
    "suites.stack.planted_shapes:TpGradientsSummedUntraced": "suites/stack/test_localise.py",
}


def planted_classes(root: Path) -> set[str]:
    """Every public class bound in a module of planted bugs (``suites/*/planted*.py``, ``suites/*/impls.py``) —
    those a factory makes (``X = _planted(...)``) included, whose own docstring is empty."""
    found = set()
    for path in sorted(root.glob("suites/*/planted*.py")) + sorted(root.glob("suites/*/impls.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for name, obj in vars(importlib.import_module(module)).items():
            if inspect.isclass(obj) and obj.__module__ == module and not name.startswith("_"):
                found.add(f"{module}:{name}")
    return found


def test_every_planted_bug_is_in_the_table_or_held_by_a_test_of_its_own():
    """A planted class no test loads proves nothing: each is in the mutation table, or held elsewhere by a test
    that names it; and each of the table's rows names a planted class and a test that exists."""
    root = mutation.ROOT
    planted = planted_classes(root)
    listed = {spec for spec, _, _ in mutation.PLANTED}
    assert len(planted) >= len(listed) > 90, (len(planted), len(listed))  # the globs see every module
    assert planted - listed - set(HELD_ELSEWHERE) == set(), "planted, in no table"
    assert listed - planted == set(), "the table names what no planted module binds"
    for spec, test in HELD_ELSEWHERE.items():
        assert spec in planted and spec.split(":")[1] in (root / test).read_text(), (spec, test)
    for spec, _, tests in mutation.PLANTED:
        path, function = tests.split("::")
        assert f"def {function}(" in (root / path).read_text(), (spec, tests)


def test_a_planted_class_in_no_table_is_named(tmp_path):
    """The rule above sees a class a module of planted bugs gains and nobody lists (a factory-made one too)."""
    (tmp_path / "suites" / "fake").mkdir(parents=True)
    (tmp_path / "suites" / "fake" / "planted.py").write_text("")
    import sys
    import types

    module = types.ModuleType("suites.fake.planted")
    exec("def _planted():\n    class Planted: pass\n    return Planted\nNew = _planted()\n_Helper = _planted()\n",
         module.__dict__)
    sys.modules["suites.fake.planted"] = module
    try:
        assert planted_classes(tmp_path) == {"suites.fake.planted:New"}
    finally:
        del sys.modules["suites.fake.planted"]
