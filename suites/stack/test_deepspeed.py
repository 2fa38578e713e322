"""DeepSpeed's engine held to one device through the stack contract (harness/adapters/deepspeed_stack.py):
``deepspeed.initialize`` over the one-device model, ZeRO 0-3 over dp, its gradient accumulation and its
2-norm clipping, SGD with momentum and Adam, both families (the GPT tied), float32 (DeepSpeed trains fp32,
fp16 or bf16), within harness/stack/case.py's bound in float32 units. What it does not compose here
(pipeline, tensor, context, expert parallelism; checkpointing; the inf norm) is unsupported in one sentence.
"""

from __future__ import annotations

import math

import pytest

from harness import registry
from harness.contracts.stack import Layout, Recipe
from reference.models import ModelSpec
from reference.zero import OptimizerSpec

from .test_equivalence import _verdict

DEEPSPEED = registry.skip_reason(registry.resolve("deepspeed", "stack"))
pytestmark = pytest.mark.skipif(bool(DEEPSPEED), reason=f"deepspeed: {DEEPSPEED}")

GPT32 = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5, dtype="float32", tie_embeddings=True)
LLAMA32 = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5, dtype="float32")

CASES = [  # (spec, layout, recipe, in every profile)
    (LLAMA32, Layout(1, 1, 1), Recipe(max_grad_norm=0.05), False),  # the finding (its watch runs in tox)
    (LLAMA32, Layout(2, 1, 1, zero=0), Recipe(accumulation=2), True),
    (LLAMA32, Layout(2, 1, 1, zero=1), Recipe(max_grad_norm=0.05), False),
    (GPT32, Layout(2, 1, 1, zero=2), Recipe(max_grad_norm=0.05, accumulation=2), True),
    (LLAMA32, Layout(2, 1, 1, zero=3), Recipe(optimizer=OptimizerSpec("adam", 1e-2, eps=1e-3)), True),
    (GPT32, Layout(4, 1, 1, zero=3), Recipe(max_grad_norm=0.05), False),
    (LLAMA32, Layout(4, 1, 1, zero=2), Recipe(accumulation=2), False),
    (GPT32, Layout(8, 1, 1, zero=1), Recipe(), False),
]


@pytest.mark.parametrize("spec, layout, recipe", [
    pytest.param(s, lay, r, id=f"{s.family}-{lay.label()}-zero{lay.zero}",
                 marks=[] if every else [pytest.mark.thorough]) for s, lay, r, every in CASES])
def test_deepspeed_equals_one_device(spec, layout, recipe, world_cache, conformance):
    v = _verdict(world_cache, conformance, "deepspeed", layout.world_size, spec, layout, recipe)
    if v["known"]:  # ZeRO 0 with clipping: the parameters are right, the norm is not reported (the finding)
        assert layout.zero == 0 and recipe.max_grad_norm is not None, v["problems"][:3]
        conformance.settle()
    assert v["outcome"] == "pass", v["problems"][:4] or v["refused"]


@pytest.mark.parametrize("layout, recipe, needle", [
    (Layout(1, 2, 1), Recipe(), "PipelineModule"),
    (Layout(2, 1, 1), Recipe(max_grad_norm=0.05, norm_type=math.inf), "clips the 2-norm"),
], ids=["pp2", "inf-norm"])
def test_what_the_deepspeed_stack_does_not_compose_is_said_in_one_sentence(layout, recipe, needle, world_cache,
                                                                          conformance):
    v = _verdict(world_cache, conformance, "deepspeed", layout.world_size, LLAMA32, layout, recipe)
    assert v["outcome"] == "unsupported" and needle in v["refused"] and "\n" not in v["refused"], v


def _norm_at_stage_0():
    import torch

    from harness.adapters.deepspeed_stack import DeepSpeedStack

    trainer = DeepSpeedStack().build(LLAMA32, Layout(1, 1, 1, zero=0), Recipe(max_grad_norm=0.05))
    trainer.load_dense(LLAMA32.build(0).state_dict())
    tokens = torch.randint(0, LLAMA32.vocab, (2, 4), generator=torch.Generator().manual_seed(0))
    trainer.step(tokens, tokens)
    return trainer.trainer.get_global_grad_norm()


def test_watch_deepspeed_reports_no_norm_at_zero_stage_0(world_cache):
    """The finding's minimal case: one rank, ZeRO 0, a clipped step — the engine clipped (the parameters equal one
    device's) and reports no norm. Fails once DeepSpeed reports it."""
    assert world_cache.get(1).run(_norm_at_stage_0, timeout=120) == [None]
