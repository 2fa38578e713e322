"""The properties catch classic collective bugs and shrink each to its minimal case.

Each planted bug lives in a subclass of the reference (suites/collectives/impls.py), loaded by spec
like a user's implementation. ``hypothesis.find`` searches the same case strategy the conformance
property uses for a failing case and shrinks it; each test then holds the bug's boundary exactly — on the found case
(one field changed, it passes) and on the minimal case run as such — not the case the shrinker stops at, which is
hypothesis' release's (the declared floor's, 6.100, stops elsewhere than 6.170 for the pipeline's planted bugs).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import find, settings

from harness.collectives.case import Case

from .property import verdict
from .strategies import cases

_SEARCH = settings(max_examples=300, database=None, deadline=None, derandomize=True)


def minimal_failure(impl: str, collective: str, world_cache, world_sizes):
    def fails(drawn) -> bool:
        n, case = drawn
        return verdict(world_cache, n, case)["outcome"] == "fail"

    return find(cases(impl, collective, world_sizes), fails, settings=_SEARCH)


def outcome(world_cache, n: int, case: Case) -> str:
    return verdict(world_cache, n, case)["outcome"]


def members(n: int, case: Case) -> int:
    """The size of the case's group on a world of n (the world's where it names none)."""
    return len(case.group) if case.group else n


def test_dropped_remainder_fails_exactly_where_the_group_does_not_divide_numel(world_cache, world_sizes):
    """The property finds the dropped remainder; the found case has a remainder and passes without one (numel made a
    multiple of its group's size). Its minimal case run as such: two ranks, one element fails; two elements pass. Which
    case hypothesis' shrinker stops at is its release's and is not asserted (6.100 and 6.170 both reach two ranks, one
    element today; the pipeline's planted-bug tests met a release that does not)."""
    if max(world_sizes) < 2:
        return  # needs two ranks; covered whenever --world-sizes has one
    impl = "suites.collectives.impls:DropsRemainder"
    n, case = minimal_failure(impl, "all_reduce", world_cache, world_sizes)
    size = members(n, case)
    assert case.numel % size, case.line(n)
    divisible = replace(case, numel=case.numel - case.numel % size or size)
    assert outcome(world_cache, n, divisible) == "pass", divisible.line(n)
    if 2 in world_sizes:
        assert [outcome(world_cache, 2, Case(impl, "all_reduce", numel=k)) for k in (1, 2)] == ["fail", "pass"]


def test_missing_average_is_caught_only_for_avg(world_cache, world_sizes):
    """The found case averages over two ranks or more and passes as a sum; minimal: two ranks, one float32 element,
    AVG fails and SUM passes; AVG on int32 gets the reference's own verdict (the plant is that one bug)."""
    if max(world_sizes) < 2:
        return
    impl = "suites.collectives.impls:ForgetsAverage"
    n, case = minimal_failure(impl, "all_reduce", world_cache, world_sizes)
    assert case.op == "avg" and members(n, case) >= 2, case.line(n)
    assert outcome(world_cache, n, replace(case, op="sum")) == "pass", case.line(n)
    if 2 in world_sizes:
        assert [outcome(world_cache, 2, Case(impl, "all_reduce", op=op)) for op in ("avg", "sum")] == ["fail", "pass"]
        integer = Case(impl, "all_reduce", dtype="int32", op="avg")
        assert outcome(world_cache, 2, integer) == outcome(world_cache, 2, replace(integer, impl="reference"))


def test_ignored_broadcast_source_is_caught_with_a_root_other_than_zero(world_cache, world_sizes):
    """The found case broadcasts from a root other than the group's first rank and passes from that first rank;
    minimal: two ranks, one element, root 1 fails and root 0 passes."""
    if max(world_sizes) < 2:
        return
    impl = "suites.collectives.impls:IgnoresSrc"
    n, case = minimal_failure(impl, "broadcast", world_cache, world_sizes)
    assert case.root != 0, case.line(n)
    assert outcome(world_cache, n, replace(case, root=0)) == "pass", case.line(n)
    if 2 in world_sizes:
        assert [outcome(world_cache, 2, Case(impl, "broadcast", root=r)) for r in (1, 0)] == ["fail", "pass"]


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


@pytest.mark.parametrize("impl, collective", [("ReduceScatterNextBlock", "reduce_scatter"),
                                              ("AllToAllBlocksByOffset", "all_to_all")])
def test_a_block_index_off_by_the_rank_is_caught_wherever_a_group_has_two_ranks(impl, collective, world_cache,
                                                                                world_sizes):
    """A chunk index off by one (reduce-scatter: rank r gets block r + 1) or by the rank (all-to-all: blocks stored by
    ring offset) is invisible in a group of one: the found case's group has two ranks or more and passes as a group
    of its first rank alone (a subgroup of one); minimal: two ranks, one element a block, fails — a rank other than 0
    for the all-to-all, whose rank 0 is right."""
    if max(world_sizes) < 2:
        return
    spec = f"suites.collectives.impls:{impl}"
    n, case = minimal_failure(spec, collective, world_cache, world_sizes)
    assert members(n, case) >= 2, case.line(n)
    alone = replace(case, group=(case.group or (0,))[:1], root=0)
    assert outcome(world_cache, n, alone) == "pass", alone.line(n)
    if 2 in world_sizes:
        result = verdict(world_cache, 2, Case(spec, collective))
        assert result["outcome"] == "fail", result
        if collective == "all_to_all":
            assert result["detail"].startswith("rank 1: "), result["detail"]
