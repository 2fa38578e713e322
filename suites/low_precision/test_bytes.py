"""The bytes one call of the reference layer sends are ``reference.cost_model.low_precision_layer_bytes`` exactly, per
recipe and layout: the layout's activations and weights, the float8 all-gather's one byte per weight element (a
quarter of float32's), and the amax all-reduces a recipe's scales need across TP shards (none for MX blocks)."""

from __future__ import annotations

import pytest

from harness.low_precision.case import Case, as_dict, count_bytes
from reference.cost_model import low_precision_layer_bytes
from reference.low_precision import recipe

CASES = [
    Case(recipe=r, kind=kind, sp=sp, tp=2) for r in ("float8-tensorwise", "float8-rowwise", "mxfp8")
    for kind in ("column", "row") for sp in (False, True)
] + [
    Case(kind="fsdp", dp=2, tp=1), Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True),
    Case(kind="fsdp", dp=4, tp=1, fp8_all_gather=True, n=30, k=10), Case(kind="replicated", dp=2, tp=1),
    Case(recipe="float8-rowwise", kind="row", dp=2, tp=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.label() for c in CASES])
def test_bytes_sent_are_the_cost_model_exactly(case, world_cache):
    granularity = recipe(case.recipe).cast("output", "w").granularity
    want = low_precision_layer_bytes(case.kind, granularity, case.tokens, case.k, case.n, dp=case.dp, tp=case.tp,
                                     sp=case.sp, fp8_all_gather=case.fp8_all_gather)
    for got in world_cache.get(case.world).run(count_bytes, "reference", as_dict(case), timeout=120):
        assert got == want, (got, want)


def test_the_float8_all_gather_moves_a_quarter_of_float32s_bytes():
    hp = low_precision_layer_bytes("fsdp", "tensor", 32, 64, 64, dp=4)
    fp8 = low_precision_layer_bytes("fsdp", "tensor", 32, 64, 64, dp=4, fp8_all_gather=True)
    amax = 2 * 3 / 4 * 4  # one float32 amax all-reduced over 4 ranks
    assert fp8["forward"] - amax == hp["forward"] / 4 and fp8["backward"] == hp["backward"]
