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

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1"]


@st.composite
def pipeline_cases(draw, impl: str, schedule: str, world_sizes: list[int]) -> PipelineCase:
    p = draw(st.sampled_from(sorted(world_sizes)))
    m = draw(st.integers(1, 8))  # m < p and m not a multiple of p included
    v = draw(st.integers(1, 2)) if schedule == "interleaved" else 1
    return PipelineCase(impl, schedule, p, m, v, batch=draw(st.integers(m, 2 * m + 3)),
                        hidden=draw(st.integers(1, 5)), layers_per_stage=draw(st.integers(1, 2)),
                        seed=draw(st.integers(0, 2**16)))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipelined_training_equals_one_device(pipeline_impl, schedule, world_cache, world_sizes, conformance):
    impl = pipeline_impl

    @settings(max_examples=max(5, settings.default.max_examples // 5))
    @given(data=st.data())
    def prop(data):
        case = data.draw(pipeline_cases(impl, schedule, world_sizes), label="case")
        world = world_cache.get(case.p)
        verdict = compare(case, single_device(case), world.run(run_rank, case, timeout=120))
        conformance.record(verdict["outcome"], suite="pipeline", backend=world.backend, world_size=case.p,
                           dtype="float64", detail=verdict["detail"], collective=schedule, numel=case.m,
                           impl=impl)
        if verdict["outcome"] == "unsupported":
            event(f"unsupported: {verdict['detail'][:80]}")
            return
        assert verdict["outcome"] == "pass", f"{case.line()}: {verdict['detail']}"

    prop()
    assert conformance.counts.get("pass", 0) > 0, f"{impl} {schedule}: every example was unsupported"
