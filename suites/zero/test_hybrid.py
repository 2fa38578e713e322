"""Hybrid sharding (HSDP: FSDP2 on a replicate x shard mesh, ZeRO within each replica, the reduced shards
all-reduced across replicas) trains like one device — over every (replicate, shard) split of 2, 4 and 8 ranks, the
degenerate ones included: (n, 1), which is plain data parallelism through the sharded machinery (pytorch #154888: such
a mesh silently never all-reduced), and (1, n), a 2-D mesh of one replica. Stages 1-3; SGD and Adam; the transformer
block at stage 3; accumulation with clipping at stage 2 (the norm over the shard group, each shard once: the replicas
hold the same). tox runs the splits of 4 ((1, 4), (2, 2), (4, 1)), the thorough env 2 and 8 too. The zero suite's
bound (``ranks.bound``). Planted, each caught: no reduction across the replicas; the shard group's sum divided by the
world size."""

from __future__ import annotations

import pytest

from harness.runtime.world import run_or_fail
from harness.zero import case as ranks
from reference.zero import StepRecipe
from suites._support.zero import judged

SPLITS = [(n, r) for n in (2, 4, 8) for r in range(1, n + 1) if n % r == 0]
"""(ranks, replicate): the shard group is n / replicate ranks."""
CLIPPED = StepRecipe(accumulation=2, max_grad_norm=0.05)


def _case(stage: int):
    """(model, optimizer, recipe) of a stage's case."""
    return {1: ("mlp", "sgd", None), 2: ("mlp", "adam", CLIPPED), 3: ("block", "sgd", None)}[stage]


@pytest.mark.parametrize("n, replicate", [pytest.param(n, r, id=f"{r}x{n // r}",
                                                       marks=[pytest.mark.thorough] if n != 4 else [])
                                          for n, r in SPLITS])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_sharding_equals_one_device(zero_impl, stage, n, replicate, world_cache, world_sizes, conformance):
    if n not in world_sizes and n != 8:
        pytest.skip(f"world size {n} is not in --world-sizes")
    model, opt, recipe = _case(stage)
    r = ranks.merge(run_or_fail(world_cache.get(n), ranks.train_case, zero_impl, stage, model, opt, 2, 4, n, None,
                                recipe, replicate, timeout=300, failed=ranks.failed))
    label = f"stage{stage}/{model}/{opt}/hsdp{replicate}x{n // replicate}"
    judged(conformance, r, zero_impl, n, label)


def test_stage_zero_and_a_split_that_does_not_divide_are_refused(world_cache):
    for stage, replicate, needle in ((0, 2, "stage 0"), (1, 3, "dividing")):
        r = ranks.merge(world_cache.get(4).run(ranks.train_case, "reference", stage, "mlp", "sgd", 1, 2, 4, None,
                                               None, replicate, timeout=120))
        assert r["refused"] and not r["unsupported"] and needle in r["refused"] and "\n" not in r["refused"], r


@pytest.mark.parametrize("planted, n, replicate, stage", [("NoReplicaReduction", 2, 2, 1),
                                                          ("NoReplicaReduction", 4, 2, 3),
                                                          ("DividesByWorld", 4, 2, 2)])
def test_planted_hybrid_bugs_fail(planted, n, replicate, stage, world_cache):
    model, opt, recipe = _case(stage)
    r = ranks.merge(world_cache.get(n).run(ranks.train_case, f"suites.zero.planted:{planted}", stage, model, opt, 2,
                                           4, n, None, recipe, replicate, timeout=300))
    assert r["problems"] and any("off by" in p for p in r["problems"]), r["problems"][:3]
