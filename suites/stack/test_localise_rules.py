"""The localisation's pure parts, no World: every shape rule on the difference it names (and not on its
neighbours'), the shrinking search on verdicts given by a rule, the dense-state readback of a gradient.

Inputs are small integer-valued tensors (exact in float64), so each rule's decision is exact: the bound only
separates 0 from a whole unit."""

from __future__ import annotations

import pytest
import torch

from harness.contracts.stack import Layout, Recipe
from harness.localise.compare import Item
from harness.localise.oracle import gradient_from_state
from harness.localise.shape import classify
from harness.localise.shrink import Case, describe, kind, shrink
from reference.models import ModelSpec
from reference.zero import LRSchedule, OptimizerSpec

BOUND = 1e-9
GPT = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5)


def _want(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 9, shape, generator=g).to(torch.float64)


def _item(got, want, rank=0, call=0, phase="reduced gradient", step=1, **meta):
    mag = float(want.abs().max())
    rel = float((got - want).abs().max()) / mag if bool(torch.isfinite(got).all()) else float("inf")
    return Item(step, phase, "blocks.0.attn.o.weight", rank, call, got, want, BOUND * mag, rel, BOUND, 0, meta)


TP2 = Layout(1, 1, 2)


def _classified(items, layout=TP2, recipe=Recipe()):
    return classify(items, layout, recipe)


def test_an_exact_factor_names_the_group_whose_size_it_is_and_which_way():
    w = _want(4, 6)
    rule, said = _classified([_item(2 * w, w, r) for r in (0, 1)])
    assert rule == "factor" and "= the size of tp" in said and "extra sum over the tp group" in said, said
    rule, said = _classified([_item(w / 2, w, r) for r in (0, 1)])
    assert rule == "factor" and "1/2" in said and "missing sum over the tp group" in said, said
    rule, said = _classified([_item(3 * w, w)])
    assert rule == "factor" and "the size of no group" in said, said
    lay = Layout(2, 1, 1, ep=2)  # ep and dp both 2: the experts' group named first, dp said too
    rule, said = _classified([_item(2 * w, w)], lay)
    assert said.startswith("an exact factor 2 = the size of ep (as is the size of dp)"), said
    rule, said = _classified([_item(2 * w, w)], Layout(), Recipe(accumulation=2))
    assert "the number of accumulation steps" in said, said


def test_a_sign_flip_and_a_nonfinite_value_are_named_before_any_factor():
    w = _want(3, 5)
    assert _classified([_item(-w, w)])[0] == "sign"
    bad = w.clone()
    bad[1, 2] = float("nan")
    rule, said = _classified([_item(w, w, 0), _item(bad, w, 1)])
    assert rule == "nonfinite" and "rank 1" in said and "1 of 15" in said, said


def test_a_zeroed_block_names_its_rows_or_its_tokens():
    w = _want(6, 4)
    got = w.clone()
    got[4:6] = 0
    rule, said = _classified([_item(got, w)])
    assert rule == "zeroed" and "rows 4-5 of 6" in said, said
    act, tokens = _want(2, 3, 4), torch.tensor([[1, 12, 3], [12, 5, 6]])
    got = act.clone()
    got[tokens == 12] = 0
    rule, said = _classified([_item(got, act, phase="forward", tokens=tokens, batch_dim=0)])
    assert rule == "zeroed" and "2 of 6 (row, position) pairs" in said and "token 12" in said, said
    rule, said = _classified([_item(torch.zeros_like(w), w, phase="update")])
    assert rule == "zeroed" and said.startswith("not updated (left stale)"), said


def test_parts_whose_sum_is_one_device_name_the_group_they_differ_in():
    w = _want(4, 4)
    part = _want(4, 4, seed=1)
    rule, said = _classified([_item(part, w, 0), _item(w - part, w, 1)])
    assert rule == "partial" and "missing sum over tp" in said and "ranks 0, 1" in said, said


def test_each_part_scaled_by_its_own_factor_is_a_per_part_normalisation():
    w = _want(4, 4)
    rule, said = _classified([_item(0.5 * w, w, call=0), _item(1.5 * w, w, call=1)], Layout())
    assert rule == "per-part" and "0.5, 1.5" in said, said


def test_right_exactly_where_the_local_position_is_the_global_one_is_a_position_offset():
    lay = Layout(1, 1, 1, cp=2)
    pos0, pos1 = torch.tensor([0, 1, 6, 7]), torch.tensor([2, 3, 4, 5])  # zigzag over 8 positions
    w0, w1 = _want(2, 4, 3), _want(2, 4, 3, seed=1)
    g0, g1 = w0.clone(), w1 + 1
    g0[:, 2:] += 1
    items = [_item(g0, w0, 0, phase="forward", positions=pos0, seq_dim=1),
             _item(g1, w1, 1, phase="forward", positions=pos1, seq_dim=1)]
    rule, said = _classified(items, lay)
    assert rule == "offset" and "local positions" in said, said
    g0[:, 1] += 1  # wrong at a position whose local index is its global one too: not an offset
    assert _classified(items, lay)[0] != "offset"


def test_blocks_in_the_wrong_order_are_a_permutation():
    w = _want(4, 6)
    got = torch.cat([w[2:], w[:2]])
    rule, said = _classified([_item(got, w)])
    assert rule == "permuted" and "dimension 0" in said and "[1, 0]" in said, said


def test_right_on_one_rank_of_a_group_only_names_the_coordinate():
    w = _want(3, 3)
    other = _want(3, 3, seed=2)
    rule, said = _classified([_item(w, w, 0), _item(other, w, 1)])
    assert rule == "one-rank" and "rank 0 only" in said and "tp coordinate" in said, said


def test_none_of_the_shapes_says_only_the_magnitude():
    w = _want(3, 3)
    rule, said = _classified([_item(w + _want(3, 3, seed=5), w)])
    assert rule == "none" and said.startswith("none of the known shapes: off by"), said


def test_an_update_off_by_adamws_decay_of_the_parameter_says_which_way():
    """lr x weight_decay = 1/4 (exact in binary), integer parameters: one decay too many moves the update by exactly
    -p / 4, a decay missing by +p / 4; another difference, or the same difference under Adam, is not this shape."""
    adamw = Recipe(optimizer=OptimizerSpec("adamw", 0.5, weight_decay=0.5, decay="matrices"))
    p, u = _want(3, 4, seed=1), _want(3, 4, seed=2)

    def update(got):
        return [_item(got, u, phase="update", before=p)]

    rule, said = _classified(update(u - p / 4), recipe=adamw)
    assert rule == "decay" and "decayed where one device's AdamW spares it (its rule: matrices)" in said, said
    rule, said = _classified(update(u + p / 4), recipe=adamw)
    assert rule == "decay" and "not decayed where one device's AdamW decays it" in said, said
    assert _classified(update(u - p / 2), recipe=adamw)[0] != "decay"
    assert _classified(update(u - p / 4), recipe=Recipe(optimizer=OptimizerSpec("adam", 0.5)))[0] != "decay"


def test_an_update_at_another_positions_learning_rate_names_the_position():
    """A schedule of exact factors (warmup 3 from 1/4: 1/4, 1/2, 3/4, then 1), integer updates: the update of step 2
    (position 1) taken at 3/2 of its lr is position 2's (one ahead, two positions per update: a scheduler stepped per
    micro-step at accumulation 2); step 3's at 2/3 position 1's (one behind); step 1's at 4 x is the peak's — position
    3's, or the base lr (the schedule not applied): both said; a factor no position gives, or the same update without
    a schedule, is not this shape."""
    plan = Recipe(optimizer=OptimizerSpec("adam", 0.5), lr_schedule=LRSchedule(warmup=3, start=0.25))
    u = _want(3, 4, seed=2)

    def update(got, step):
        return [_item(got, u, phase="update", step=step)]

    rule, said = _classified(update(u * 3 / 2, 2), recipe=plan)
    assert rule == "schedule" and "at position 2's lr: the scheduler 1 update ahead (2 positions per update" in said, \
        said
    rule, said = _classified(update(u * 2 / 3, 3), recipe=plan)
    assert rule == "schedule" and "at position 1's lr: the scheduler 1 update behind" in said, said
    rule, said = _classified(update(4 * u, 1), recipe=plan)
    assert rule == "schedule" and "at position 3's lr" in said and "the optimizer's base lr" in said, said
    assert _classified(update(u * 5 / 3, 2), recipe=plan)[0] != "schedule"
    assert _classified(update(u * 3 / 2, 2), recipe=Recipe(optimizer=OptimizerSpec("adam", 0.5)))[0] != "schedule"


def _fails_when(rule):
    calls = []

    def verdict(case):
        calls.append(case)
        return ("fail", ["rank 0: step 1: parameter x: off by 1 of its magnitude > 1e-12"]) if rule(case) \
            else ("pass", [])
    return verdict, calls


START = Case(GPT, Layout(2, 2, 2, zero=1, checkpointing=True), Recipe(max_grad_norm=0.05, accumulation=2), steps=2)
PROBLEMS = ["rank 0: step 1: parameter x: off by 1 of its magnitude > 1e-12"]


def test_shrinking_keeps_what_the_bug_needs_and_says_which_removal_makes_it_pass():
    verdict, calls = _fails_when(lambda c: c.layout.tp > 1 and c.recipe.accumulation > 1)
    s = shrink(verdict, START, PROBLEMS, budget=40)
    m = s.minimal
    assert (m.layout.world_size, m.layout.tp, m.recipe.accumulation, m.steps) == (2, 2, 2, 1), describe(m)
    assert m.recipe.max_grad_norm is None and not m.layout.checkpointing and m.layout.zero == 0
    assert set(s.passes_with) == {"tp 1", "no accumulation"}, s.passes_with
    assert s.calls == len(calls) <= 40
    assert s.line().startswith("Fails at dp 2 x pp 2 x tp 2, ZeRO 1, checkpointing, accumulation 2, clipping at "
                               "0.05, 2 steps; minimal: tp 2, accumulation 2, one step — passes with "), s.line()


def test_shrinking_stays_within_its_budget_and_a_failure_of_another_kind_is_not_the_bug():
    verdict, calls = _fails_when(lambda c: True)
    s = shrink(verdict, START, PROBLEMS, budget=3)
    assert s.calls == len(calls) == 3 and s.unknown, (s.calls, s.unknown)

    def crashes_below_tp2(case):
        if case.layout.tp < 2:
            return "fail", ["rank 0: step raised RuntimeError: boom"]
        return "fail", PROBLEMS
    s = shrink(crashes_below_tp2, START, PROBLEMS, budget=40)
    assert s.minimal.layout.tp == 2 and "tp 1" not in s.passes_with and "tp 1" in s.unknown, s.line()
    assert kind(["rank 1: RuntimeError: x (after 1 step(s))"]) == kind(["rank 1: build raised ValueError: x"]) == \
        "raised"
    assert kind(PROBLEMS + ["rank 0: gradient norm 1.2 vs one device 1.0 (off by 0.2 > 1e-12)"]) == "values"


def test_the_gradient_is_read_back_from_the_optimizer_state():
    g1, g2 = _want(3), _want(3, seed=1)
    sgd = OptimizerSpec("sgd", 0.1, momentum=0.9)
    m1 = {"w": {"momentum_buffer": g1}}
    m2 = {"w": {"momentum_buffer": 0.9 * g1 + g2}}
    assert torch.equal(gradient_from_state(sgd, m1, None)["w"], g1)
    assert torch.allclose(gradient_from_state(sgd, m2, m1)["w"], g2, rtol=0, atol=1e-14)
    adam = OptimizerSpec("adam", 0.1, betas=(0.5, 0.9))
    a1 = {"w": {"exp_avg": 0.5 * g1}}
    assert torch.equal(gradient_from_state(adam, a1, None)["w"], g1)
    assert gradient_from_state(OptimizerSpec("sgd", 0.1, momentum=0.0), m1, None) is None


@pytest.mark.parametrize("layout", [Layout(1, 1, 1, cp=2, ep=2), Layout(2, 1, 1, ep=2)])
def test_dropping_a_dimension_keeps_the_layout_expressible(layout):
    from harness.localise.shrink import smaller

    for label, case in smaller(Case(ModelSpec("moe", vocab=13, hidden=16, heads=4, kv_heads=2, ffn=8, layers=3,
                                                experts=4, top_k=2), layout, Recipe())):
        assert (case.layout.dp * case.layout.cp) % case.layout.ep == 0, label
