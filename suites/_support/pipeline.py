"""The pipeline suites' hypothesis strategy: a case of any p, m (m < p and m not a multiple of p included), v,
batch, width and depth, shared by the equivalence property and the planted-bug table."""

from __future__ import annotations

from hypothesis import strategies as st

from harness.pipeline.case import PipelineCase
from reference.pipeline import INTERLEAVED, stages_per_rank


@st.composite
def pipeline_cases(draw, impl: str, schedule: str, world_sizes: list[int]) -> PipelineCase:
    p = draw(st.sampled_from(sorted(world_sizes)))
    m = draw(st.integers(1, 8))  # m < p and m not a multiple of p included
    v = draw(st.integers(1, 2)) if schedule in INTERLEAVED else stages_per_rank(schedule)
    per_stage = draw(st.integers(1, 2))
    case = PipelineCase(impl, schedule, p, m, v, batch=draw(st.integers(m, 2 * m + 3)),
                        hidden=draw(st.integers(1, 5)), layers_per_stage=per_stage, seed=draw(st.integers(0, 2**16)),
                        extra_layers=draw(st.integers(0, p * v - 1)))  # layers % stages != 0 too
    shared = [""] + ["stage"] * (per_stage > 1) + ["tied"] * (case.placement[0] == case.placement[-1])
    return PipelineCase(**{**case.as_row(), "shared": draw(st.sampled_from(shared))})
