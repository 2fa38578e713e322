"""A stack equals one device under the pipeline schedules of 2026: ZB-H1 and interleaved zero bubble (the backward
split into I and W), ZB-V and DualPipeV (two stages per rank placed as a V: the embedding and the LM head on pipeline
rank 0). Each case at pp = 2 with what makes a schedule's bugs show: accumulation (W's of two passes summed),
clipping (the norm of gradients that W produced), a tied embedding where the V puts both copies on one rank, FSDP
sharding, tensor parallelism inside the stages. Float64 with SGD (ours, torch), float32 with Adam (torchtitan,
ours, torch). A stack that does not run a schedule says so (unsupported, its sentence)."""

from __future__ import annotations

import math

import pytest

from harness.contracts.stack import Layout, Recipe
from reference.models import ModelSpec
from suites._support.stack import ADAM, GPT, LLAMA, LLAMA32, held

TIED = ModelSpec(**{**GPT.as_dict(), "tie_embeddings": True})
CASES = [
    ("zb-h1", LLAMA, Layout(1, 2, 2, schedule="zb-h1"), Recipe(max_grad_norm=0.05, accumulation=2)),
    ("interleaved-zb", GPT, Layout(1, 2, 1, schedule="interleaved-zb", checkpointing=True),
     Recipe(max_grad_norm=0.02, norm_type=math.inf)),
    ("zbv-tied", TIED, Layout(1, 2, 1, schedule="zbv"), Recipe(max_grad_norm=0.05)),
    ("zbv-fsdp", LLAMA, Layout(2, 2, 1, zero=2, schedule="zbv"), Recipe(accumulation=2)),
    ("dualpipev", LLAMA, Layout(1, 2, 2, schedule="dualpipev"), Recipe(max_grad_norm=0.05)),
    ("dualpipev-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="dualpipev"), Recipe(optimizer=ADAM, accumulation=2)),
    ("zbv-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="zbv"), Recipe(optimizer=ADAM, max_grad_norm=0.05)),
    ("interleaved-zb-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="interleaved-zb"), Recipe(optimizer=ADAM)),
]


@pytest.mark.parametrize("spec, layout, recipe", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_stack_under_the_schedule_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance):
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe, padded=True)
    assert not v["problems"], v["problems"][:4]
