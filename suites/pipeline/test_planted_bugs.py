"""The equivalence property catches a mean-for-sum mistake, and torch's default gradient scaling,
and shrinks each to its minimal case."""

from __future__ import annotations

from hypothesis import find, settings

from harness.pipeline.case import PipelineCase, compare, run_rank, single_device

from .test_equivalence import pipeline_cases

_SEARCH = settings(max_examples=100, database=None, deadline=None, derandomize=True)


def minimal_failure(impl: str, schedule: str, world_cache, world_sizes):
    def fails(case) -> bool:
        verdict = compare(case, single_device(case), world_cache.get(case.p).run(run_rank, case, timeout=120))
        return verdict["outcome"] == "fail"

    return find(pipeline_cases(impl, schedule, world_sizes), fails, settings=_SEARCH)


def test_averaged_microbatch_losses_fail_from_two_microbatches(world_cache, world_sizes):
    case = minimal_failure("suites.pipeline.impls:AveragesMicrobatches", "1f1b", world_cache, world_sizes)
    assert (case.p, case.m) == (min(world_sizes), 2), case.line()  # m = 1 is the one case a mean is a sum


def test_torch_default_scale_grads_is_wrong_for_a_summed_loss(world_cache, world_sizes):
    case = minimal_failure("suites.pipeline.impls:TorchDefaultScaling", "gpipe", world_cache, world_sizes)
    assert (case.p, case.m) == (min(world_sizes), 2), case.line()


def test_a_missing_gradient_or_loss_is_a_failure_with_its_detail_not_a_crash(world_cache, world_sizes):
    p = min(s for s in world_sizes if s > 1) if max(world_sizes) > 1 else 1
    for impl, needle in (("suites.pipeline.impls:DropsAGradient", "step-1 gradient of parameter 0: no gradient"),
                         ("suites.pipeline.impls:ReturnsNoLoss", "step returned NoneType on the last stage's rank")):
        case = PipelineCase(impl, "1f1b", p, 3, batch=5, hidden=2)
        verdict = compare(case, single_device(case), world_cache.get(p).run(run_rank, case))
        assert verdict["outcome"] == "fail" and needle in verdict["detail"], verdict
