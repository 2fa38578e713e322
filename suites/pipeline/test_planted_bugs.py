"""The equivalence property catches a mean-for-sum mistake, and torch's default gradient scaling,
and shrinks each to its minimal case."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import find, settings

from harness.pipeline.case import PipelineCase, compare, run_rank, single_device
from harness.runtime.world import run_or_fail
from suites._support.pipeline import pipeline_cases
from suites._support.worlds import gloo_only, hang_window

_SEARCH = settings(max_examples=100, database=None, deadline=None, derandomize=True)


def outcome(case, world_cache) -> str:
    return compare(case, single_device(case), world_cache.get(case.p).run(run_rank, case, timeout=120))["outcome"]


def minimal_failure(impl: str, schedule: str, world_cache, world_sizes):
    return find(pipeline_cases(impl, schedule, world_sizes), lambda case: outcome(case, world_cache) == "fail",
                settings=_SEARCH)


def fails_from_two_microbatches(impl: str, schedule: str, world_cache, world_sizes) -> None:
    """The property finds the bug and shrinks it to m = 2, and the same case at m = 1 passes (a mean of one loss is its
    sum; one micro-batch's gradient divided by 1). The found case's p is not asserted: hypothesis' shrinker reaches the
    smallest p in its newer releases and stops at 2 or 3 in the declared floor's (6.100: the draws after p change with
    p), which says nothing of the code under test."""
    case = minimal_failure(impl, schedule, world_cache, world_sizes)
    assert case.m == 2, case.line()
    assert outcome(replace(case, m=1), world_cache) == "pass", case.line()


def test_averaged_microbatch_losses_fail_from_two_microbatches(world_cache, world_sizes):
    fails_from_two_microbatches("suites.pipeline.impls:AveragesMicrobatches", "1f1b", world_cache, world_sizes)


def test_torch_default_scale_grads_is_wrong_for_a_summed_loss(world_cache, world_sizes):
    fails_from_two_microbatches("suites.pipeline.impls:TorchDefaultScaling", "gpipe", world_cache, world_sizes)


def test_a_missing_gradient_or_loss_is_a_failure_with_its_detail_not_a_crash(world_cache, world_sizes):
    p = min(s for s in world_sizes if s > 1) if max(world_sizes) > 1 else 1
    for impl, needle in (("suites.pipeline.impls:DropsAGradient", "step-1 gradient of parameter 0: no gradient"),
                         ("suites.pipeline.impls:ReturnsNoLoss", "step returned NoneType on the last stage's rank")):
        case = PipelineCase(impl, "1f1b", p, 3, batch=5, hidden=2)
        verdict = compare(case, single_device(case), world_cache.get(p).run(run_rank, case))
        assert verdict["outcome"] == "fail" and needle in verdict["detail"], verdict


def test_one_stage_raising_is_a_fail_naming_that_rank(world_cache, world_sizes):
    """The last stage's rank raises (uneven microbatches) while the others block in their sends and
    receives: a fail verdict naming that rank's exception, its peers ended after the World's grace."""
    p = 3 if 3 in world_sizes else max(world_sizes)
    if p < 2:
        pytest.skip("needs two ranks")
    case = PipelineCase("suites.pipeline.impls:LastStageRaises", "1f1b", p, 2, 1, batch=5, hidden=2, seed=0)
    per_rank = run_or_fail(world_cache.get(p), run_rank, case, timeout=120, failed=lambda detail: {"failed": detail})
    verdict = compare(case, single_device(case), per_rank)
    assert verdict["outcome"] == "fail", verdict
    assert verdict["detail"].startswith(f"rank {p - 1}: step raised ValueError: uneven microbatches (5 rows in 2) on "
                                        "the last stage"), verdict["detail"]
    assert "still inside the code under test" in verdict["detail"], verdict["detail"]


def test_a_pipeline_that_hangs_at_few_microbatches_is_a_fail_in_seconds(world_cache, world_sizes):
    """A hand-written 1F1B (Megatron's loop, no schedule as data, no validator) whose cool-down counts p - rank - 1
    backwards where min(p - rank - 1, m) forwards ran: at p = 3, m = 1 rank 0 waits for a gradient no rank sends,
    its peers for rank 0 — a true hang, called a fail within the hang window (3 s here, 10 by default) naming where
    each rank waits, the World usable after. Held at its boundary: the same case with the count clamped passes, and
    the plant passes at m = p - 1, where the two counts agree."""
    if max(world_sizes) < 3:
        pytest.skip("needs three ranks (at p = 2 the unclamped count never exceeds m)")
    world = world_cache.get(3)
    gloo_only(world, "the hand-written 1F1B runs on gloo only (tagged messages, a wait that blocks the host)")

    def outcome(impl, m):
        case = PipelineCase(f"suites.pipeline.{impl}", "1f1b", 3, m, 1, batch=2 * m, hidden=2, seed=m)
        per_rank = run_or_fail(world, run_rank, case, timeout=120, failed=lambda detail: {"failed": detail})
        return compare(case, single_device(case), per_rank)

    with hang_window(world, 3.0):
        verdict = outcome("impls:UnclampedCooldown1F1B", 1)
    assert verdict["outcome"] == "fail", verdict
    assert verdict["detail"].startswith("rank 0 is in _recv at handwritten.py:"), verdict["detail"]
    assert verdict["detail"].count("no rank progressed in run_rank for 3 s: a deadlock") == 1, verdict["detail"]
    assert outcome("handwritten:HandWritten1F1B", 1)["outcome"] == "pass"
    assert outcome("impls:UnclampedCooldown1F1B", 2)["outcome"] == "pass"
