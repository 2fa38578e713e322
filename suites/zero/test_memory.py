"""Per-rank memory of model state, measured from the tensors each implementation keeps, against
``cost_model.training_memory`` for the stage and DP size: exact for the reference (its padding rule
computed here: one flat buffer padded to a multiple of N for stages 1-2, one per module for stage 3),
reported with the ratio for third parties, whose sharding must at least shrink the total."""

from __future__ import annotations

import pytest

from harness.records import registry
from harness.zero import case as ranks
from reference.cost_model import training_memory
from suites._support.zero import THIRD_PARTY_SIZES

ELEM = {"float64": 8, "float32": 4}


def _reference_bytes(stage: int, n: int, numel: int, units: list[int], elem: int, k: int) -> dict:
    """What the reference must hold: Psi elements, or its padded shards (ceil(Psi / N) per rank)."""
    shard = -(-numel // n)
    if stage == 0:
        return {"params": numel * elem, "grads": numel * elem, "optimizer": numel * k}
    if stage in (1, 2):
        return {"params": shard * n * elem, "grads": shard * (n if stage == 1 else 1) * elem, "optimizer": shard * k}
    shards = sum(-(-u // n) for u in units)
    return {"params": shards * elem, "grads": shards * elem, "optimizer": shards * k}


def _model(stage: int, n: int, numel: int, elem: int, k: int) -> dict:
    m = training_memory(numel, zero_stage=stage, dp=n, weight_bytes=elem, grad_bytes=elem, optimizer_bytes=k)
    return {"params": m.weights, "grads": m.gradients, "optimizer": m.optimizer}


def _measure(world_cache, impl, stage, n, model, opt):
    r = world_cache.get(n).run(ranks.train_case, impl, stage, model, opt, 1, 2, 0, timeout=300)[0]
    if r["refused"]:
        pytest.skip(r["refused"])
    k = ranks.spec_for(opt).state_bytes_per_param(ELEM[r["dtype"]])
    return r, k


@pytest.mark.parametrize("model", ["mlp", "block"])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_reference_memory_is_the_model_up_to_padding(model, opt, world_cache, world_sizes):
    units = world_cache.get(1).run(ranks.unit_sizes, model)[0]
    for n in world_sizes:
        for stage in (0, 1, 2, 3):
            r, k = _measure(world_cache, "reference", stage, n, model, opt)
            elem = ELEM[r["dtype"]]
            exact = _reference_bytes(stage, n, r["numel"], units, elem, k)
            assert r["memory"] == exact, (stage, n, r["memory"], exact)
            padding = (n - 1) * len(units) * max(elem, k)  # < N padding elements per flat buffer
            for what, predicted in _model(stage, n, r["numel"], elem, k).items():
                assert abs(r["memory"][what] - predicted) <= padding, (stage, n, what, r["memory"], predicted)


def test_third_party_memory_is_reported_and_shrinks_with_sharding(zero_impl, world_cache, world_sizes, sweep,
                                                                  conformance):
    if registry.resolve(zero_impl, "zero").only_ops:
        pytest.skip(f"{zero_impl} is a variant of another implementation")
    sharded = [n for n in world_sizes if n > 1]
    if not sharded:
        pytest.skip("sharding needs dp > 1")
    sizes = sweep.rows(sharded, lambda n: n in THIRD_PARTY_SIZES,
                       f"thorough: dp sizes other than {', '.join(map(str, THIRD_PARTY_SIZES))}")
    for n in sizes:
        totals = {}
        for stage in (0, 1, 2, 3):
            r, k = _measure(world_cache, zero_impl, stage, n, "block", "adam")
            predicted = _model(stage, n, r["numel"], ELEM[r["dtype"]], k)
            ratios = ", ".join(f"{w} {r['memory'][w]} B = {r['memory'][w] / predicted[w]:.2f}x model"
                               for w in ("params", "grads", "optimizer"))
            conformance.record("pass", suite="zero", world_size=n, dtype=r["dtype"], collective=f"memory/stage{stage}",
                               numel=r["numel"], impl=zero_impl, detail=ratios)
            totals[stage] = sum(r["memory"].values())
        assert totals[3] < totals[0], f"{zero_impl} dp {n}: ZeRO-3 holds {totals[3]} B, no less than DP's {totals[0]}"
