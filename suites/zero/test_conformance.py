"""Every data-parallel / ZeRO implementation x stage x DP size x optimizer x model trains like one device:
after 1 and after 5 steps, loss, full parameters, full gradients and optimizer state within the bound
derived in ranks.bound (float64; float32 where the implementation trains only that, against a float32
single device). The whole grid, not a sample: 4 DP sizes x 2 optimizers x 2 models per stage."""

from __future__ import annotations

import itertools

import pytest

from harness.runtime.world import run_or_fail
from harness.zero import case as ranks
from suites._support.zero import THIRD_PARTY_SIZES, skip_unless_stage

STEPS, PER_RANK = 5, 2


def _held(zero_impl, stage, cases, world_cache, conformance) -> None:
    """Each (dp size, model, optimizer) of ``cases`` trained against one device, recorded as a conformance row; the
    failures' first lines asserted away."""
    failures = []
    for n, model, opt in cases:
        r = ranks.merge(run_or_fail(world_cache.get(n), ranks.train_case, zero_impl, stage, model, opt, STEPS,
                                    PER_RANK, n, timeout=300, failed=ranks.failed))
        case = f"stage {stage}, dp {n}, {model}, {opt}"
        if r["refused"]:
            conformance.record("unsupported" if r["unsupported"] else "refused", suite="zero", world_size=n,
                               collective=f"stage{stage}/{model}/{opt}", impl=zero_impl, detail=r["refused"])
            assert r["unsupported"], f"{case}: refused a valid stage: {r['refused']}"
            continue
        worst = r["worst"]
        conformance.record("fail" if r["problems"] else "pass", suite="zero", world_size=n, dtype=r["dtype"],
                           collective=f"stage{stage}/{model}/{opt}", numel=r["numel"], impl=zero_impl,
                           max_rel_err=worst, detail=" | ".join(r["problems"][:1]))
        failures += [f"{case}: {p}" for p in r["problems"][:2]]
    assert not failures, "\n".join(failures[:6])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_training_equals_one_device(zero_impl, stage, world_cache, world_sizes, sweep, conformance):
    skip_unless_stage(zero_impl, stage)
    tox_sizes = world_sizes if zero_impl.startswith("reference") else \
        [n for n in world_sizes if n in THIRD_PARTY_SIZES] or world_sizes
    sizes = sweep.rows(world_sizes, lambda n: n in tox_sizes, "thorough: a third party's other dp sizes")
    _held(zero_impl, stage, itertools.product(sizes, ("mlp", "block"), ("sgd", "adam")), world_cache, conformance)
    assert conformance.counts.get("pass", 0) > 0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_adamw_decays_only_what_its_rule_decays(zero_impl, stage, world_cache, world_sizes, conformance):
    """AdamW (weight decay 0.1, the biases and norms spared: ``harness.zero.case.ADAMW``) at every stage, dp 2 (the
    largest size the session has, where it has no 2), both models: a flat shard laying a bias or a LayerNorm's weight
    beside a matrix must decay each element by its own parameter (the planted ``FlatShardDecayedWhole`` decays the
    shard whole)."""
    skip_unless_stage(zero_impl, stage)
    n = 2 if 2 in world_sizes else max(world_sizes)
    _held(zero_impl, stage, [(n, model, "adamw") for model in ("mlp", "block")], world_cache, conformance)


@pytest.mark.parametrize("planted, stage, steps", [("MissingAverage", 0, 1), ("ShiftedShardBoundary", 2, 1),
                                                   ("RankOneDrifts", 0, 1)])
def test_planted_bug_is_caught(planted, stage, steps, world_cache, world_sizes):
    """A missing gradient average (dp > 1), a shard boundary one element off (any dp), and a replica that
    drifts on rank 1 only (dp > 1: seen only because every rank's state is compared) must fail."""
    sizes = [n for n in world_sizes if n > 1 or planted == "ShiftedShardBoundary"]
    if not sizes:
        pytest.skip("needs dp > 1")
    for n in sizes:
        per_rank = world_cache.get(n).run(ranks.train_case, f"suites.zero.planted:{planted}", stage, "mlp", "sgd",
                                          steps, PER_RANK, n)
        r = ranks.merge(per_rank)
        assert r["problems"], f"planted {planted} at dp {n} went unnoticed: {r['checks']}"
        if planted == "RankOneDrifts":  # rank 0's parameters are right: only rank 1's own view shows the drift
            assert not any(": params " in p for p in per_rank[0]["problems"]), per_rank[0]["problems"]
            assert any(p.startswith("rank 1: step 1: params ") for p in r["problems"]), r["problems"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_reference_shards_gather_back_exactly(stage, world_cache, world_sizes):
    for n, model in itertools.product(world_sizes, ("mlp", "block")):
        problems = [p for rank in world_cache.get(n).run(ranks.shards_roundtrip, stage, model) for p in rank]
        assert not problems, f"stage {stage}, dp {n}, {model}: {problems[:3]}"


def test_an_implementation_that_raises_is_a_failure_with_its_detail(world_cache, world_sizes):
    n = max(world_sizes)
    r = ranks.merge(world_cache.get(n).run(ranks.train_case, "suites.zero.planted:StepRaises", 0, "mlp", "sgd", 2,
                                           PER_RANK, n))
    assert r["problems"] and all("step 1 raised RuntimeError: optimizer state on the wrong device" in p
                                 for p in r["problems"]), r["problems"]


def test_one_rank_raising_is_a_fail_naming_that_rank(world_cache, world_sizes):
    """The last rank's step raises while its peers block in the gradient reduction: the verdict is that
    rank's exception, its peers ended after the World's grace."""
    n = max(world_sizes)
    if n < 2:
        pytest.skip("needs two ranks")
    r = ranks.merge(run_or_fail(world_cache.get(n), ranks.train_case, "suites.zero.planted:LastRankStepRaises", 0,
                                "mlp", "sgd", 2, PER_RANK, n, failed=ranks.failed))
    assert len(r["problems"]) == 1 and r["problems"][0].startswith(
        f"rank {n - 1}: step 1 raised ValueError: bucket size not divisible on the last rank"), r["problems"]
    assert "still inside the code under test" in r["problems"][0], r["problems"]
