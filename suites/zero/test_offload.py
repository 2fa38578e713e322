"""Offloading (the sharded state on the host: FSDP2's ``CPUOffloadPolicy``, DeepSpeed's ZeRO-Offload —
``offload_optimizer``, and ``offload_param`` at stage 3) takes other code paths than the device ones, even on a CPU
host; held to one device with Adam and gradient accumulation (2 micro-steps), unclipped and clipped, at every stage
each offloads at. DeepSpeed's offloaded ZeRO 1/2 copied only the first micro-step's gradients for a year and a half
(PR 7967): planted here (``OffloadKeepsFirstMicroStep``), caught. The DeepSpeed adapter asserts its ZeRO optimizer
reports the offload (else the case would not run the path: unsupported, saying so)."""

from __future__ import annotations

import pytest

from harness.runtime.world import run_or_fail
from harness.zero import case as ranks
from reference.zero import StepRecipe
from suites._support.zero import judged

RECIPES = {"accumulate-2": StepRecipe(accumulation=2), "accumulate-2+clip": StepRecipe(2, 0.05)}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offloaded_training_equals_one_device(zero_impl, stage, recipe, world_cache, conformance):
    n = 2
    r = ranks.merge(run_or_fail(world_cache.get(n), ranks.train_case, zero_impl, stage, "mlp", "adam", 2, 4, n, None,
                                RECIPES[recipe], None, True, timeout=300, failed=ranks.failed))
    label = f"stage{stage}/mlp/adam/offload/{recipe}"
    judged(conformance, r, zero_impl, n, label)


def test_stage_zero_offload_is_refused(world_cache):
    """DeepSpeed's: stage 0 shards nothing to offload — one sentence."""
    from harness.records import registry

    why = registry.skip_reason(registry.resolve("deepspeed", "zero"))
    if why:
        pytest.skip(why)
    r = ranks.merge(world_cache.get(2).run(ranks.train_case, "deepspeed", 0, "mlp", "adam", 1, 2, 2, None, None,
                                           None, True, timeout=120))
    if r["unsupported"]:
        pytest.skip(r["refused"])
    assert r["refused"] and "stage 0" in r["refused"] and "\n" not in r["refused"], r


@pytest.mark.parametrize("stage", [1, 2])
def test_planted_first_micro_step_only_fails(stage, world_cache):
    r = ranks.merge(world_cache.get(2).run(ranks.train_case, "suites.zero.planted:OffloadKeepsFirstMicroStep", stage,
                                           "mlp", "adam", 2, 4, 2, None, RECIPES["accumulate-2"], None, True,
                                           timeout=300))
    assert r["problems"] and any("off by" in p for p in r["problems"]), r["problems"][:3]
