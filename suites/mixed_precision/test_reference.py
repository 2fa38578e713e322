"""Mixed precision (reference.mixed_precision.MixedPrecisionZero) against one device running the same
recipe — the model in bf16 / fp16, fp32 master weights and optimizer state — at every ZeRO stage, DP 2
(and 4 in the thorough env), the gradient reduced in fp32 or in the low precision: every rank's fp32
masters after 3 SGD steps within the bound derived in harness/mixed_precision/case.py (the
reduction-order difference in the low precision; measured 5.6e-5 vs bound 1.1e-3 in bf16 at DP 2). fp16
with a dynamic loss scaler started at 2^18: the overflowing steps (4 of 6) are skipped on every rank as
on one device, scaler states equal. Memory: what each rank holds, measured from live tensors, equals
cost_model.training_memory for Adam (K = 12) at every stage and N = 2, 4, 8 — the ZeRO paper's table
with measured numbers."""

from __future__ import annotations

import pytest
import torch

from harness.mixed_precision import case
from harness.runtime.capabilities import require_dtype
from reference.cost_model import training_memory

GRID = [(stage, dtype, reduce) for stage in (0, 1, 2, 3)
        for dtype, reduce in (("bfloat16", "float32"), ("bfloat16", "low"), ("float16", "float32"))]


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.thorough)])  # DP 4: the thorough env
@pytest.mark.parametrize("stage, dtype, reduce", GRID, ids=lambda v: str(v))
def test_mixed_precision_equals_one_device_running_the_same_recipe(n, stage, dtype, reduce, world_cache,
                                                                    conformance):
    require_dtype(world_cache.get(n), dtype, conformance, suite="mixed_precision", impl="reference",
                  collective=f"stage{stage}/reduce-{reduce}")
    per_rank = world_cache.get(n).run(case.train_mixed, stage, dtype, reduce, timeout=300)
    problems = [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="mixed_precision", world_size=n, dtype=dtype,
                       collective=f"stage{stage}/reduce-{reduce}", impl="reference",
                       max_rel_err=max(r["worst"] for r in per_rank), detail=" | ".join(problems[:1]))
    assert not problems, problems[:3]


@pytest.mark.parametrize("stage", [0, 3])
def test_fp16_overflow_steps_are_skipped_everywhere_as_on_one_device(stage, world_cache):
    require_dtype(world_cache.get(4), "float16")
    per_rank = world_cache.get(4).run(case.train_mixed, stage, "float16", "float32", 6, 4, 0, 2.0**18,
                                      timeout=300)
    assert all(r["scaler"] == {"scale": 32768.0, "growth_tracker": 0, "skipped": 4} for r in per_rank), per_rank[0]
    assert not [p for r in per_rank for p in r["problems"]], per_rank[0]["problems"]


def test_a_missing_average_is_caught(world_cache):
    require_dtype(world_cache.get(2), "bfloat16")
    per_rank = world_cache.get(2).run(case.train_mixed, 0, "bfloat16", "float32", 3, 4, 0, None, "missing-average",
                                      timeout=300)
    assert all(r["problems"] for r in per_rank)


@pytest.mark.parametrize("n", [2, 4, pytest.param(8, marks=pytest.mark.thorough)])  # 8: 9 s, the thorough env's
def test_memory_per_rank_is_the_zero_papers_model_with_k_12(n, world_cache):
    require_dtype(world_cache.get(n), "bfloat16")
    psi = sum(a * b + b for a, b in zip(case.SIZES, case.SIZES[1:], strict=False))
    for stage in (0, 1, 2, 3):
        per_rank = world_cache.get(n).run(case.train_mixed, stage, "bfloat16", "float32", 1, 4, 0, None, None,
                                          "adam", timeout=300)
        want = training_memory(psi, zero_stage=stage, dp=n)
        for r in per_rank:
            assert r["memory"] == {"params": want.weights, "grads": want.gradients, "optimizer": want.optimizer}, \
                (stage, r["memory"], want)


@pytest.mark.parametrize("model_dtype, kwargs, said", [
    (torch.float32, {"stage": 1}, "mixed precision trains a bfloat16 or float16 model; this one is torch.float32."),
    (torch.bfloat16, {"stage": 4}, "ZeRO stage must be 0, 1, 2 or 3; got 4."),
    (torch.bfloat16, {"stage": 3, "divisor": 4}, "a reduction divisor applies to ZeRO stages 0-2."),
    (torch.float16, {"stage": 2, "reduce_dtype": torch.bfloat16},
     "reduce_dtype must be float32 or the model's torch.float16; got torch.bfloat16."),
    (torch.bfloat16, {"stage": 0, "replicate": object()},
     "hybrid sharding shards ZeRO 1-3's state within a group; stage 0 shards none."),
])
def test_a_recipe_mixed_precision_cannot_train_is_one_sentence_before_any_collective(model_dtype, kwargs, said):
    """In process, no World: each refusal comes before the first collective (a group of None is never reached)."""
    from reference.mixed_precision import MixedPrecisionZero
    from reference.zero import OptimizerSpec

    with pytest.raises(ValueError) as info:
        MixedPrecisionZero(torch.nn.Linear(2, 2, dtype=model_dtype), OptimizerSpec("sgd", 0.1), **kwargs)
    assert str(info.value) == said
