"""The 3D suite's corners, held through the stack contract (one reference trainer, one oracle): the reference
stack on 2 x 2 x 2 with every (schedule, ZeRO stage, checkpointing) combination, the GPT's embedding tied to its
LM head (on the first and the last stage: summed over the embedding group) and keyed dropout 0.1 at once, three
steps, the 2-norm clipped, 2 pipeline passes accumulated in every other combination — every rank's dense state
against one device within harness/stack/case.py's bound. In tox one combination per schedule (each with its own
ZeRO stage, 1F1B checkpointed); the other 15 in the thorough env. Every other layout of 1-8 ranks, with the tie
and dropout rotated, is the main property's (test_equivalence.py).

Planted bugs, each at its smallest layout: parameters replicated over TP counted in the norm on every TP rank
(TransformerEngine PR 715), each pipeline stage clipping by its own norm (torchtitan #596), the tied copies'
gradients never summed, and a step that raises on the last rank only while its peers wait inside theirs (a fail
naming that rank, in seconds). The clipping and tie seams' smallest layouts run for every stack (``stack_impl``),
so the mutation check plugs the planted stacks in there."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.stack.judge import hold
from reference.models import ModelSpec
from suites._support.stack import GPT, held
from suites._support.threed import COMBOS

TIED = ModelSpec(**{**GPT.as_dict(), "tie_embeddings": True, "dropout": 0.1})
PLANTED = "suites.stack.planted:"


def _combos():
    for i, (schedule, zero, checkpointing) in enumerate(COMBOS):
        j = i // 6  # the schedule's index: one of its six in tox, with its own ZeRO stage (1F1B checkpointed)
        in_tox = (zero, checkpointing) == (j % 3, j == 1)
        layout = Layout(2, 2, 2, zero=zero, schedule=schedule, checkpointing=checkpointing)
        recipe = Recipe(max_grad_norm=0.05, accumulation=1 + i % 2)
        yield pytest.param(layout, recipe, id=f"{layout.label()}-zero{zero}-{schedule}-acc{recipe.accumulation}",
                           marks=[] if in_tox else [pytest.mark.thorough])


@pytest.mark.parametrize("layout, recipe", list(_combos()))
def test_every_2x2x2_combination_with_the_tie_and_dropout_equals_one_device(layout, recipe, world_cache,
                                                                           conformance):
    v = hold(world_cache, conformance, "reference", 8, TIED, layout, recipe, steps=3)
    assert v["outcome"] == "pass", v["refused"] or v["problems"][:4]
    assert all(len(r["losses"]) == 3 for r in v["per_rank"])


SMALLEST = [(Layout(1, 1, 2), Recipe(max_grad_norm=0.05)), (Layout(1, 2, 1), Recipe(max_grad_norm=0.05))]
"""The clipping seams' smallest layouts: TP (a replicated parameter counted once), PP (the norm over both stages,
the tied copies summed), each clipped at step 1."""


@pytest.mark.parametrize("layout, recipe", SMALLEST, ids=["1x1x2-clipped", "1x2x1-clipped"])
def test_the_clipping_and_tie_seams_at_their_smallest_layouts(stack_impl, layout, recipe, world_cache, conformance):
    v = held(world_cache, conformance, stack_impl, layout.world_size, TIED, layout, recipe)
    assert not v["problems"], v["problems"][:4]


@pytest.mark.parametrize("planted, layout, needle", [
    ("ReplicatedCountedTpTimes", Layout(1, 1, 2), "gradient norm"),
    ("PpNotReduced", Layout(1, 2, 1), "gradient norm"),
    ("TiedNotSummed", Layout(1, 2, 1), "parameter embed.weight")])
def test_planted_bugs_fail_at_the_smallest_layout(planted, layout, needle, world_cache, conformance):
    ours = hold(world_cache, conformance, "reference", layout.world_size, TIED, layout, Recipe(max_grad_norm=0.05))
    assert ours["outcome"] == "pass", ours["problems"][:4]  # the same case without the bug holds
    v = hold(world_cache, conformance, PLANTED + planted, layout.world_size, TIED, layout, Recipe(max_grad_norm=0.05),
             localise=False)
    assert v["outcome"] == "fail" and any(needle in p for p in v["problems"]), (v["outcome"], v["problems"][:4])


def test_a_stack_that_raises_on_one_rank_is_a_fail_naming_that_rank(world_cache, conformance):
    v = hold(world_cache, conformance, PLANTED + "LastRankRaises", 4, TIED, Layout(1, 2, 2), Recipe(), localise=False)
    assert v["outcome"] == "fail" and len(v["problems"]) == 1, v["problems"]
    assert v["problems"][0].startswith("rank 3: RuntimeError: sequence length"), v["problems"]
    assert "still inside the code under test" in v["problems"][0], v["problems"]
