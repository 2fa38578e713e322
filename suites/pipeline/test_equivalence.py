"""Pipelined training equals single-device training, for every implementation and schedule.

One global batch (integer-valued, float64) is split into m microbatches with tensor_split; the loss is
sum-reduced. After step 1 the loss and every gradient must equal the single-device ones bit for bit
(all values are integers); after 3 SGD-with-momentum steps the parameters must agree within the
rounding bound derived in harness/pipeline/case.py (step_tolerance).
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from harness.pipeline.case import PipelineCase, compare, run_rank, single_device
from harness.records import findings
from harness.runtime.world import run_or_fail
from reference.pipeline import GENERATORS, INTERLEAVED, V_SHAPED, stages_per_rank
from suites._support.pipeline import pipeline_cases

SCHEDULES = list(GENERATORS)


def corner_cases(impl: str, schedule: str, world_sizes: list[int]) -> list[PipelineCase]:
    """The classic corners, run before any random draw so that every profile covers them: p = 3 (a middle
    stage) and the largest p; m < p; m = 1; m > p with batch % m != 0; two layers per stage with the last stage's
    first layer applied twice (a weight used twice on one path: the split backward must not count it twice;
    equal microbatches, so that torch runs it too);
    a padded batch (its last microbatch only padding: loss 0, zero gradients) on layers that do not divide by
    the stages (one short of two per stage: the last stage holds one); and, for the V-shaped
    schedules, the first and the last layer tied (one module on rank 0, the V's first and last stage) with
    m >= 2p (DualPipe's steady state with its overlapped pairs)."""
    v = 2 if schedule in INTERLEAVED else stages_per_rank(schedule)
    out = []
    for p in sorted({s for s in world_sizes if s == 3} | {max(world_sizes)}):
        ms = 2 * p if schedule in V_SHAPED else p + 1  # even microbatches: torch runs only those
        out += [PipelineCase(impl, schedule, p, max(p - 1, 1), v, batch=2 * p + 1, hidden=3, seed=p),
                PipelineCase(impl, schedule, p, 1, v, batch=3, hidden=2, seed=p + 1),
                PipelineCase(impl, schedule, p, ms, v, batch=2 * ms, hidden=2, layers_per_stage=2, seed=p + 2,
                             shared="stage"),
                PipelineCase(impl, schedule, p, p + 1, v, batch=2 * p + 3, hidden=2, seed=p + 3, padded=True,
                             extra_layers=p * v - 1)]
        if schedule in V_SHAPED:
            out.append(PipelineCase(impl, schedule, p, 2 * p + 1, v, batch=4 * p + 2, hidden=2, seed=p + 4,
                                    shared="tied"))
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipelined_training_equals_one_device(pipeline_impl, schedule, world_cache, world_sizes, conformance):
    impl = pipeline_impl

    def check(case: PipelineCase) -> dict:
        world = world_cache.get(case.p)
        per_rank = run_or_fail(world, run_rank, case, timeout=120, failed=lambda detail: {"failed": detail})
        verdict = compare(case, single_device(case), per_rank)
        known = (findings.match(impl, "pipeline", verdict["problems"], schedule=schedule, shared=case.shared)
                 if verdict["outcome"] == "fail" else None)
        conformance.record("known-nonconformance" if known else verdict["outcome"], finding=known, suite="pipeline",
                           backend=world.backend, world_size=case.p, dtype="float64", detail=verdict["detail"],
                           collective=schedule, numel=case.m, impl=impl)
        assert known or verdict["outcome"] in ("pass", "unsupported"), f"{case.line()}: {verdict['detail']}"
        return verdict

    for case in corner_cases(impl, schedule, world_sizes):
        check(case)

    @settings(max_examples=max(5, settings.default.max_examples // 5))
    @given(data=st.data())
    def prop(data):
        verdict = check(data.draw(pipeline_cases(impl, schedule, world_sizes), label="case"))
        if verdict["outcome"] == "unsupported":
            event(f"unsupported: {verdict['detail'][:80]}")

    prop()
    assert conformance.counts.get("pass", 0) > 0, f"{impl} {schedule}: every example was unsupported"
    conformance.settle()  # examples a known finding explains: xfail with its reason (--strict: fail)
