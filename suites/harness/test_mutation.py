"""The mutation runner (suites/mutation.py) tells a caught bug from a correct implementation. The whole
planted set runs in CI after the tests (.ci/run: python -m suites.mutation), not here: it takes minutes."""

from __future__ import annotations

import pytest

from suites import mutation

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

def test_runner_flags_a_planted_bug_and_not_a_correct_implementation():
    tests = "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"
    caught = mutation.run([("suites.collectives.impls:IgnoresSrc", "broadcast from rank 0", tests),
                           ("suites.collectives.impls:ring_unpipelined", "correct", tests)],
                          extra_args=("-k", "broadcast", "--world-sizes", "2,3"))
    assert caught["suites.collectives.impls:IgnoresSrc"] == [
        "test_collective_matches_exact_oracle[suites.collectives.impls:IgnoresSrc-broadcast]"], caught
    assert caught["suites.collectives.impls:ring_unpipelined"] == [], caught


def test_every_planted_bug_is_in_the_table():
    """A class whose docstring says "Planted bug" is one the mutation check must run."""
    import importlib
    import inspect

    listed = {spec for spec, _, _ in mutation.PLANTED}
    planted = set()
    for module in ("suites.collectives.impls", "suites.pipeline.impls", "suites.tensor_parallel.planted",
                   "suites.zero.planted", "suites.checkpoint.planted", "suites.stack.planted"):
        for name, obj in vars(importlib.import_module(module)).items():
            if inspect.isclass(obj) and obj.__module__ == module and "Planted bug" in (obj.__doc__ or ""):
                planted.add(f"{module}:{name}")
    assert planted and planted <= listed, sorted(planted - listed)
