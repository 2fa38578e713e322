"""The properties catch classic collective bugs and shrink each to its minimal case.

Each planted bug lives in a subclass of the reference (suites/collectives/impls.py), loaded by spec
like a user's implementation. ``hypothesis.find`` searches the same case strategy the conformance
property uses for a failing case and shrinks it; the minimal case is then known exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import find, settings

from .property import verdict
from .strategies import cases

_SEARCH = settings(max_examples=300, database=None, deadline=None, derandomize=True)


def minimal_failure(impl: str, collective: str, world_cache, world_sizes):
    def fails(drawn) -> bool:
        n, case = drawn
        return verdict(world_cache, n, case)["outcome"] == "fail"

    return find(cases(impl, collective, world_sizes), fails, settings=_SEARCH)


def test_dropped_remainder_shrinks_to_two_ranks_one_element(world_cache, world_sizes):
    if max(world_sizes) < 2:
        return  # needs two ranks; covered whenever --world-sizes has one
    n, case = minimal_failure("suites.collectives.impls:DropsRemainder", "all_reduce", world_cache, world_sizes)
    assert (n, case.numel, case.group) == (2, 1, None), case.line(n)


def test_missing_average_is_caught_only_for_avg(world_cache, world_sizes):
    if max(world_sizes) < 2:
        return
    n, case = minimal_failure("suites.collectives.impls:ForgetsAverage", "all_reduce", world_cache, world_sizes)
    assert case.op == "avg" and n == 2 and case.numel == 1, case.line(n)


def test_ignored_broadcast_source_is_caught_with_root_one(world_cache, world_sizes):
    if max(world_sizes) < 2:
        return
    n, case = minimal_failure("suites.collectives.impls:IgnoresSrc", "broadcast", world_cache, world_sizes)
    assert (n, case.root, case.numel, case.group) == (2, 1, 1, None), case.line(n)


def test_corners_catch_what_the_default_profile_can_miss(world_cache, world_sizes):
    """Recursive doubling that leaves out the ranks beyond the largest power of two is invisible at world
    sizes 1, 2, 4; the corner table (run before any random draw, in every profile) has world size 3."""
    from .property import corner_cases, verdict

    if 3 not in world_sizes:
        pytest.skip("needs a 3-rank world")
    failing = [(n, c) for n, c in corner_cases("suites.collectives.impls:RhdLeavesOutExtraRanks", "all_reduce",
                                                world_sizes) if verdict(world_cache, n, c)["outcome"] == "fail"]
    assert failing and {n for n, _ in failing} == {3}, [c.line(n) for n, c in failing]
    assert not [c for n, c in corner_cases("reference-rhd", "all_reduce", world_sizes)
                if verdict(world_cache, n, c)["outcome"] != "pass"]


def test_one_rank_raising_fails_the_property_naming_that_rank(world_cache, world_sizes, conformance):
    """The last rank raises on an odd length while its peers block in the all-reduce: the property's
    first corner with numel 1 fails with that rank's exception (its peers ended after the World's grace,
    not at the deadline), and the example is a fail row."""
    if max(world_sizes) < 2:
        pytest.skip("needs two ranks")
    from .property import check_collective

    n = 3 if 3 in world_sizes else max(world_sizes)
    with pytest.raises(AssertionError) as failure:
        check_collective("suites.collectives.impls:LastRankRaisesOnOddLength", "all_reduce", world_cache, [n],
                         conformance)
    message = str(failure.value)
    assert "numel=1 " in message and (
        f": rank {n - 1}: raised ValueError: odd length 1 not supported on the last rank (ranks "
        f"{list(range(n - 1))} of {n} were still inside the code under test") in message, message
    assert conformance.counts.get("fail") == 1, conformance.counts
