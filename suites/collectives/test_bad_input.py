"""Bad arguments to the reference collectives: one clear sentence naming the value and what is valid."""

from __future__ import annotations

import pytest

from .ranks import reference_avg_on_integers, reference_error


@pytest.mark.parametrize("call, needle", [
    ("reduce_scatter_sizes", "reduce_scatter: the larger tensor must hold group size * the smaller"),
    ("all_gather_sizes", "all_gather: the larger tensor must hold group size * the smaller"),
    ("all_to_all_sizes", "divisible by the group size"),
    ("non_contiguous", "tensor must be contiguous"),
    ("unknown_op", "op must be one of sum, avg, max, min, product; got 'median'"),
    ("bad_root", "src must be a rank of the group"),
    ("bad_algorithm", "all_reduce_algorithm must be one of ring, rhd, tree, naive; got 'butterfly'"),
])
def test_reference_rejects_bad_arguments(world_cache, world_sizes, call, needle):
    messages = world_cache.get(max(world_sizes)).run(reference_error, call)
    assert all(needle in m for m in messages), messages


def test_avg_on_integers_is_unsupported_not_emulated(world_cache, world_sizes):
    messages = world_cache.get(max(world_sizes)).run(reference_avg_on_integers)
    assert all("AVG is defined for floating dtypes only" in m for m in messages), messages


def test_whatever_an_implementation_does_is_a_verdict_not_a_crash(world_cache, world_sizes):
    """Accepting integer AVG (outside the contract) and raising a plain error are failures with their
    detail, from the suite's own verdict function — never a KeyError or a RankFailure out of the oracle."""
    from harness.collectives.case import Case

    from .property import verdict

    n = max(world_sizes)
    if n < 2:
        pytest.skip("needs two ranks")
    got = verdict(world_cache, n, Case("suites.collectives.impls:AcceptsIntegerAvg", "all_reduce", "int32", 3, "avg"))
    assert got["outcome"] == "fail" and "accepted AVG on int32, which the contract leaves out" in got["detail"]
    got = verdict(world_cache, n, Case("suites.collectives.impls:RaisesOnRankOne", "all_gather", "float32", 2))
    assert got["outcome"] == "fail" and "rank 1: raised RuntimeError: out of buffers" in got["detail"], got


def test_a_harness_error_is_its_own_outcome():
    """A failure of the oracle itself is outcome "error" (pytest: HarnessError, named in the summary), and it
    outranks whatever the implementation did on the other ranks."""
    from harness.collectives.case import merge

    err = {"outcome": "error", "wrong": 0, "detail": "rank 0: harness error in the oracle: KeyError: 'x'"}
    fail = {"outcome": "fail", "wrong": 2, "detail": "rank 1: 2 of 3 elements wrong"}
    assert merge([fail, err])["outcome"] == "error"
    assert merge([fail, {"outcome": "pass", "wrong": 0, "detail": ""}])["outcome"] == "fail"
