"""A stack asked for a float8 / MX recipe (``Recipe.low_precision``: the blocks' linear layers) equals one device
running the same recipe, precision-matched (``harness.stack.mixed``: within ``allowed_ratio`` x E_T, E_T one device's
distance from exact arithmetic per tensor), and computes in float8: the casts its step ran are counted
(``harness.stack.casts``) — a stack that trains the layers in float32 is within the bound (closer to exact, not
farther) and fails by the count.

The family is the Llama (no biases): a GPT's key bias has a gradient that is zero in exact arithmetic (the softmax
does not see a shift of every key's score), so both runs' masters of it are pure fp32 rounding noise and their
ratio to E_T is noise over noise (7.5 E_T measured on one rank, the same arithmetic as one device's in another
order) — a ratio that says nothing about the recipe. MXFP8's weight-gradient GEMM scales blocks of 32 tokens: its
cases run rows of 32 (``harness.stack.mixed.seq_of``: every micro-batch tiles its blocks whole) on a Llama whose
projections are 32 wide per TP shard (blocks a shard would split are refused)."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.stack.judge import hold
from reference.models import ModelSpec
from reference.zero import OptimizerSpec
from suites._support.stack import held, named_cases

FP8 = ModelSpec("llama", vocab=13, hidden=32, heads=4, kv_heads=2, ffn=64, layers=3, dtype="float32")
ADAM = OptimizerSpec("adam", 1e-2)
"""torchtitan's stack trains Adam, AdamW or Muon (no SGD): its float8 cases are Adam's."""
MX = ModelSpec("llama", vocab=13, hidden=64, heads=2, kv_heads=2, ffn=64, layers=2, dtype="float32")
"""Every projection's dimensions 64 (32 per shard at tp 2: q, k, v, gate, up column-parallel; o, down row-parallel)."""
CASES = [  # (id, spec, layout, recipe)
    ("tensorwise", FP8, Layout(), Recipe(low_precision="float8-tensorwise")),
    ("rowwise-fsdp-accumulate", FP8, Layout(2, zero=2), Recipe(low_precision="float8-rowwise", accumulation=2)),
    ("tensorwise-pp-clip", FP8, Layout(1, 2, 1), Recipe(low_precision="float8-tensorwise", max_grad_norm=0.05)),
    ("rowwise-tp", FP8, Layout(1, 1, 2), Recipe(low_precision="float8-rowwise")),
    ("tensorwise-fsdp-tp", FP8, Layout(2, 1, 2, zero=2), Recipe(low_precision="float8-tensorwise")),
    ("tensorwise-dp-pp", FP8, Layout(2, 2, 1, zero=2), Recipe(low_precision="float8-tensorwise", accumulation=2)),
    ("rowwise-adam-tp", FP8, Layout(1, 1, 2), Recipe(low_precision="float8-rowwise", optimizer=ADAM)),
    ("rowwise-adam-fsdp-pp", FP8, Layout(2, 2, 1, zero=2), Recipe(low_precision="float8-rowwise", optimizer=ADAM,
                                                                   accumulation=2)),
    ("mxfp8-fsdp-accumulate", MX, Layout(2, zero=2), Recipe(low_precision="mxfp8", accumulation=2)),
    ("mxfp8-tp", MX, Layout(1, 1, 2), Recipe(low_precision="mxfp8", max_grad_norm=0.05)),
    ("mxfp8-pp", MX, Layout(1, 2, 1), Recipe(low_precision="mxfp8")),
]


THOROUGH = {"tensorwise-fsdp-tp", "tensorwise-dp-pp", "mxfp8-pp", "rowwise-adam-fsdp-pp", "rowwise-tp",
            "mxfp8-fsdp-accumulate"}
"""tox's budget: four ranks each, 3-5 s a stack (dp x tp and dp x pp, each dimension already met in tox alone); MXFP8
under pp and FSDP (pp is met in tox by tensorwise, FSDP by rowwise, MXFP8 by TP); rowwise TP with SGD (rowwise TP
runs in tox with Adam, on every stack including torchtitan's)."""


@pytest.mark.parametrize("spec, layout, recipe", named_cases(CASES, THOROUGH))
def test_stack_under_a_float8_recipe_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance):
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe)
    assert v["outcome"] == "pass", v["problems"][:4]


def test_a_stack_that_computes_in_float32_when_asked_float8_fails_by_its_casts(world_cache, conformance):
    """Planted (``Float8NotApplied``): within the bound — and failed by the count, saying so."""
    v = hold(world_cache, conformance, "suites.stack.planted:Float8NotApplied", 1, FP8, Layout(),
             Recipe(low_precision="float8-rowwise"), localise=False)
    assert v["outcome"] == "fail" and "float8 casts: 0" in v["problems"][0] and "high precision" in v["problems"][0], \
        v["problems"]


def test_a_missing_dp_average_under_float8_fails_by_the_bound(world_cache, conformance):
    """The recipe's own error does not hide a wrong reduction: dp 2 summed, not averaged."""
    v = hold(world_cache, conformance, "suites.stack.planted:MixedMissingAverage", 2, FP8, Layout(2, 1, 1),
             Recipe(low_precision="float8-tensorwise"), localise=False)
    assert v["outcome"] == "fail" and any("master" in p and "E_T" in p for p in v["problems"]), v["problems"][:3]
