"""The seams of a data-parallel step (issue #14): gradient accumulation (k micro-steps before each
optimizer step: DDP no_sync, ZeroRedundancyOptimizer, FSDP2 set_requires_gradient_sync, DeepSpeed
gradient_accumulation_steps, the reference) equals one device on the k-times batch with each micro-step's
loss divided by k; global-norm clipping after the reduction (max_norm 0.05 clips: this MLP's gradient
2-norm is ~0.9, its inf norm ~0.6) equals one device's torch.nn.utils.clip_grad_norm_, the reported norm
included. Every stage, DP 2, the 43-parameter MLP, SGD with momentum, 2 steps, the zero suite's bound
(ranks.bound), every rank's state compared. Measured (torch 2.13, deepspeed 0.19.8, CPU): reference and
torch within 1e-15 (norms bitwise but one ULP), DeepSpeed within 2.1e-7 in float32 (bound 2.5e-5); DeepSpeed
clips only the 2-norm (the inf norm: unsupported) and reports no norm at stage 0 (its parameters are still
held to one device). Padded batches (``masked``: target rows of NaN count nothing, the loss the mean over the
global batch's counted rows — rank 0 holding 3 of its 4 rows, rank 1 none, so its micro-steps count nothing)
at every stage, unclipped and clipped; planted, the per-micro-step and the per-rank means (both caught)."""

from __future__ import annotations

import math

import pytest

from harness.runtime.world import run_or_fail
from harness.zero import case as ranks
from reference.zero import StepRecipe
from suites._support.zero import skip_unless_stage

RECIPES = {"accumulate-2": StepRecipe(accumulation=2), "accumulate-2+clip": StepRecipe(2, 0.05),
           "clip-inf": StepRecipe(max_grad_norm=0.05, norm_type=math.inf),
           "masked-accumulate-2": StepRecipe(2, masked=True),
           "masked-accumulate-2+clip": StepRecipe(2, 0.05, masked=True)}
"""The masked ones: a padded batch (``ranks.mask_rows``), the loss over its counted rows — unclipped, so a scale
shows in the update (clipping below the norm would hide it), and clipped, so the reported norm is held."""
SLOW = {"deepspeed": ("accumulate-2+clip", "masked-accumulate-2", "clip-inf")}  # ~4 s a run


def _dp(world_sizes) -> int:
    return 2 if 2 in world_sizes else max(world_sizes)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_accumulation_and_clipping_equal_one_device(zero_impl, stage, world_cache, world_sizes, conformance):
    skip_unless_stage(zero_impl, stage)
    n, failures = _dp(world_sizes), []
    for name in SLOW.get(zero_impl, RECIPES):
        recipe = RECIPES[name]
        r = ranks.merge(run_or_fail(world_cache.get(n), ranks.train_case, zero_impl, stage, "mlp", "sgd", 2, 4, n,
                                    None, recipe, timeout=300, failed=ranks.failed))
        if r["refused"]:
            conformance.record("unsupported" if r["unsupported"] else "refused", suite="zero", world_size=n,
                               collective=f"stage{stage}/mlp/sgd/{name}", impl=zero_impl, detail=r["refused"])
            assert r["unsupported"], f"stage {stage} {name}: refused: {r['refused']}"
            continue
        conformance.record("fail" if r["problems"] else "pass", suite="zero", world_size=n, dtype=r["dtype"],
                           collective=f"stage{stage}/mlp/sgd/{name}", numel=r["numel"], impl=zero_impl,
                           max_rel_err=r["worst"], detail=" | ".join(r["problems"][:1]))
        failures += [f"{name}: {p}" for p in r["problems"][:2]]
        if recipe.max_grad_norm is not None:  # the case clipped: one device's norm was above max_norm
            assert all(c["norms"][1] > recipe.max_grad_norm for c in r["checks"]), r["checks"]
    assert not failures, "\n".join(failures[:6])


def test_averaging_the_micro_steps_twice_is_caught(world_cache, world_sizes):
    r = ranks.merge(world_cache.get(_dp(world_sizes)).run(
        ranks.train_case, "suites.zero.planted:AveragesMicroStepsTwice", 0, "mlp", "sgd", 1, 4, 2, None,
        RECIPES["accumulate-2"]))
    assert any(": grads " in p for p in r["problems"]), r["problems"]


@pytest.mark.parametrize("planted", ["MeanPerMicroStep", "MeanPerRank"])
def test_the_per_micro_step_and_per_rank_means_are_caught_on_a_padded_batch(planted, world_cache, world_sizes):
    """Each planted normalisation equals one device on full batches and fails on the padded one (rank 1's
    micro-steps count nothing: 0 / 0, and rank 0's weigh its rows by how its micro-steps are padded)."""
    def run(recipe):
        return ranks.merge(world_cache.get(_dp(world_sizes)).run(
            ranks.train_case, f"suites.zero.planted:{planted}", 0, "mlp", "sgd", 2, 4, 2, None, recipe))

    assert not run(RECIPES["accumulate-2"])["problems"]
    masked = run(RECIPES["masked-accumulate-2"])["problems"]
    assert any(": params " in p for p in masked), masked  # the weights, not only the loss's 0 / 0


def test_clipping_each_shard_by_its_own_norm_is_caught_where_a_shard_is_clipped(world_cache, world_sizes):
    """Each ZeRO 2 rank clipping its shard by that shard's norm fails clipped (the norm it reports and the weights
    off) and equals one device unclipped, and at stage 0 (an all-reduced gradient: the reference's own clip)."""
    n = _dp(world_sizes)
    if n < 2:
        pytest.skip("needs two ranks")

    def problems(stage: int, recipe: str) -> list[str]:
        return ranks.merge(world_cache.get(n).run(ranks.train_case, "suites.zero.planted:ClipsByShardNorm", stage,
                                                  "mlp", "sgd", 2, 4, n, None, RECIPES[recipe]))["problems"]

    clipped = problems(2, "accumulate-2+clip")
    assert any(": gradient norm off" in p for p in clipped) and any(": params " in p for p in clipped), clipped
    assert problems(2, "accumulate-2") == [] and problems(0, "accumulate-2+clip") == []
