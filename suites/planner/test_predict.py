"""The prediction: equal to its parts, equal to the hand-computed model on a layout simple enough to
write down, and ranking layouts as a planted profile makes them."""

from __future__ import annotations

import itertools

import pytest

from harness.cost_model.predict import PARTS, gpt_workload, mlp_workload, predict_step
from reference.pipeline import GENERATORS, generate, simulate

from .synthetic import profile

WORK = gpt_workload(512, 128, 8, 512, 8, 64, 2)  # the 3D bench's GPT
LAYOUTS = [(dp, pp, 8 // (dp * pp)) for dp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if 8 % (dp * pp) == 0]
ROUNDING = 1e-12  # sums of a few dozen positive float64 terms


@pytest.mark.parametrize("dp, pp, tp", LAYOUTS)
@pytest.mark.parametrize("schedule", list(GENERATORS))
def test_predicted_step_equals_its_parts(dp, pp, tp, schedule):
    prof = profile(8, overhead=2e-3)
    pred = predict_step(prof, WORK, dp, pp, tp, 1, schedule, 2 * pp, recompute=schedule == "gpipe")
    assert pred["step_s"] == pytest.approx(sum(pred[k] for k in PARTS), rel=ROUNDING)
    assert all(pred[k] >= 0 for k in PARTS)
    # the busiest rank's compute, communication and idle time fill the simulated makespan
    assert pred["makespan_s"] == pytest.approx(sum(pred[k] for k in ("compute_s", "tp_s", "pp_s", "bubble_s")),
                                               rel=ROUNDING)
    assert (pred["tp_s"] > 0) == (tp > 1) and (pred["pp_s"] > 0) == (pp > 1) and (pred["dp_s"] > 0) == (dp > 1)
    assert 0 <= pred["bubble_fraction"] < 1 and (pred["bubble_fraction"] == 0) == (pp == 1)


def test_data_parallel_step_by_hand():
    """dp = 2, ZeRO 0, no pipeline, no TP: m (F + B) + per-tensor all-reduces + the loss all-reduce."""
    rate, overhead, m = 1e10, 3e-3, 3
    prof = profile(2, rate=rate, overhead=overhead)
    pred = predict_step(prof, WORK, 2, 1, 1, 0, "1f1b", m)
    fwd = WORK.layers * WORK.layer_flops + WORK.head_flops
    f = fwd / rate + WORK.layers * overhead / 3
    b = 2 * fwd / rate + 2 * WORK.layers * overhead / 3
    grads = (WORK.layers * WORK.layer_params + WORK.end_params) * 4
    ar = prof.collective_time
    dp = ar("all_reduce", 2, grads, 2) + (16 * WORK.layers - 1) * ar("all_reduce", 2, 0, 2)
    assert pred["compute_s"] == pytest.approx(m * (f + b), rel=ROUNDING)
    assert pred["dp_s"] == pytest.approx(dp, rel=ROUNDING)
    assert pred["sync_s"] == pytest.approx(ar("all_reduce", 2, 8, 2), rel=ROUNDING)
    assert pred["step_s"] == pytest.approx(m * (f + b) + dp + ar("all_reduce", 2, 8, 2), rel=ROUNDING)


def test_pipeline_bubble_is_the_schedules_at_equal_stage_costs():
    """Free communication, equal stages: the simulated bubble is the schedule's textbook one."""
    work = mlp_workload(8, 64, 16)
    for schedule, m in itertools.product(["gpipe", "1f1b"], [2, 4, 8]):
        pred = predict_step(profile(2, free_comm=True), work, 1, 2, 1, 0, schedule, m)
        unit = simulate(generate(schedule, 2, m), {"F": 1.0, "B": 2.0}).bubble_fraction
        # stage 0 skips its first layer's input gradient (its B is 7 of 8 layer-units): rank 0 is busy a little
        # less, so the bubble is a little above the textbook one, never below
        assert pred["bubble_fraction"] == pytest.approx(unit, abs=0.05)
        assert pred["bubble_fraction"] >= unit - 1e-12


def test_the_v_schedules_price_two_half_stages_per_rank():
    """zbv / dualpipev: 2 pp stages of half the layers, placed as a V; at free communication and equal stages the
    planner's bubble is near the schedule's unit-cost one (stage 0 skips its first input gradient) and below 1F1B's."""
    work = mlp_workload(8, 64, 16)
    for schedule in ("zbv", "dualpipev"):
        pred = predict_step(profile(2, free_comm=True), work, 1, 2, 1, 0, schedule, 8)
        unit = simulate(generate(schedule, 2, 8)).bubble_fraction
        one = predict_step(profile(2, free_comm=True), work, 1, 2, 1, 0, "1f1b", 8)
        assert pred["bubble_fraction"] == pytest.approx(unit, abs=0.05), schedule
        assert pred["bubble_fraction"] < one["bubble_fraction"], schedule


def _ranking(prof, zero=1):
    times = {f"{dp}x{pp}x{tp}": predict_step(prof, WORK, dp, pp, tp, zero, "1f1b", 2 * pp)["step_s"]
             for dp, pp, tp in LAYOUTS}
    return sorted(times, key=times.get)


def test_planted_profiles_rank_layouts_as_constructed():
    # free communication and no per-layer overhead: per-rank compute falls as 1/tp, and pipelines idle
    free = _ranking(profile(8, free_comm=True))
    assert free[0] == "1x1x8"
    assert max(free.index(x) for x in free if x.endswith("x4")) < min(free.index(x) for x in free if x.endswith("x1"))
    # a planted slow all-reduce (1 s per step): every layout without TP before every layout with it
    slow_tp = _ranking(profile(8, tp_alpha=1.0))
    assert all(x.endswith("x1") for x in slow_tp[:4]) and not any(x.endswith("x1") for x in slow_tp[4:])
    # a planted slow point-to-point message (1 s): every layout without a pipeline before every one with it
    slow_pp = _ranking(profile(8, p2p=1.0))
    assert all(x.split("x")[1] == "1" for x in slow_pp[:4]) and all(x.split("x")[1] != "1" for x in slow_pp[4:])


def test_a_message_costs_computing_ranks_what_the_profile_says():
    """gpipe at p = 2, m = 2: rank 0 sends 2 activations and receives 2 gradients; each costs it ``loaded``."""
    work, loaded = mlp_workload(4, 64, 16), 1e-3
    base = profile(2)
    with_load = profile(2)
    with_load.p2p.append({"what": "loaded", "world_size": 2, "alpha_s": loaded, "beta_s_per_byte": 0.0,
                          "median_rel_error": 0.0, "max_rel_error": 0.0, "points": 4})
    a, b = (predict_step(p, work, 1, 2, 1, 0, "gpipe", 2) for p in (base, with_load))
    assert b["pp_s"] - a["pp_s"] == pytest.approx(4 * loaded, rel=1e-9)
    assert b["step_s"] > a["step_s"] and b["bubble_fraction"] > a["bubble_fraction"]


def test_simulate_takes_per_stage_costs():
    sched = generate("gpipe", 2, 2)
    even = simulate(sched, {"F": 1.0, "B": 2.0})
    heavy = simulate(sched, {"F": 1.0, "B": 2.0, (1, "F"): 3.0, (1, "B"): 6.0})
    # (m + p - 1)(F + B) = 9; stage 1 three times as slow: its 2 x (3 + 6) after stage 0's first F,
    # then stage 0's last B
    assert even.makespan == 9.0 and heavy.makespan == 1.0 + 2 * 3.0 + 2 * 6.0 + 2.0
    assert heavy.bubble_fraction > even.bubble_fraction


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_context_parallel_step_by_hand(algorithm):
    """cp = 2 alone, ZeRO 0, m microbatches: each rank computes half the tokens, each layer pays its cp exchange
    forward and backward (the ring: 1 K/V block forward, 3 blocks backward, each one message; Ulysses: four
    all-to-alls each way, priced as all-gathers of the same bytes), the gradients sync over cp."""
    rate, m, cp = 1e10, 2, 2
    prof = profile(2, rate=rate)
    work = gpt_workload(512, 128, 8, 512, 4, 64, 2)
    pred = predict_step(prof, work, 1, 1, 1, 0, "1f1b", m, cp=cp, cp_algorithm=algorithm)
    fwd = (work.layers * work.layer_flops + work.head_flops) / cp
    assert pred["compute_s"] == pytest.approx(m * 3 * fwd / rate, rel=ROUNDING)
    local = 2 * (64 // cp) * 16 * 4  # rows x seq / cp x head_dim x fp32 bytes
    if algorithm == "ring":
        per_layer = (1 + 3) * prof.message_time("one_way", 2 * 8 * local, 2)  # K and V of 8 heads
    else:
        per_layer = 2 * 4 * prof.collective_time("all_gather", 2, 8 * local, 2)  # 8 heads each, 4 tensors
    assert pred["cp_s"] == pytest.approx(m * work.layers * per_layer, rel=ROUNDING)
    grads = (work.layers * work.layer_params + work.end_params) * 4
    ar = prof.collective_time
    dp = ar("all_reduce", 2, grads, 2) + (16 * work.layers - 1) * ar("all_reduce", 2, 0, 2)
    assert pred["dp_s"] == pytest.approx(dp, rel=ROUNDING)
    assert pred["sync_s"] == pytest.approx(ar("all_reduce", 2, 8, 2), rel=ROUNDING)
    assert pred["tp_s"] == pred["pp_s"] == 0.0
    assert pred["bubble_s"] == pytest.approx(0.0, abs=ROUNDING * pred["makespan_s"])  # makespan minus its parts
    assert pred["step_s"] == pytest.approx(sum(pred[k] for k in PARTS), rel=ROUNDING)


def test_context_parallel_with_every_dimension_adds_up():
    prof = profile(8, overhead=1e-3)
    pred = predict_step(prof, WORK, 1, 2, 2, 1, "1f1b", 4, recompute=True, cp=2)
    assert pred["cp_s"] > 0 and pred["tp_s"] > 0 and pred["pp_s"] > 0
    assert pred["makespan_s"] == pytest.approx(sum(pred[k] for k in ("compute_s", "tp_s", "cp_s", "pp_s", "bubble_s")),
                                               rel=ROUNDING)
    # a planted slow point-to-point message: the ring's exchange grows with it, Ulysses' (collectives) does not
    slow = profile(8, p2p=1e-2)
    ring, ulysses = (predict_step(slow, WORK, 2, 1, 2, 1, "1f1b", 2, cp=2, cp_algorithm=a)["cp_s"]
                     for a in ("ring", "ulysses"))
    assert ring > 10 * ulysses
    with pytest.raises(ValueError, match="cp \\(3\\) must divide the sequence \\(64 tokens\\)"):
        predict_step(profile(6), WORK, 1, 1, 2, 0, "1f1b", 2, cp=3)
    with pytest.raises(ValueError, match="no attention"):
        predict_step(profile(2), mlp_workload(4, 64, 16), 1, 1, 1, 0, "1f1b", 2, cp=2)


def test_expert_parallel_step_by_hand():
    """dp 2 x ep 2, ZeRO 0, no pipeline or TP: each layer's dispatch and combine all-to-alls (tokens x top_k rows)
    forward and backward, priced as all-gathers of those bytes; the experts' gradients sync over their expert-
    data-parallel group of 1 (nothing), the rest over dp."""
    from harness.cost_model.predict import moe_workload

    m, prof = 2, profile(2)
    work = moe_workload(gpt_workload(512, 128, 8, 512, 4, 64, 2), 128, 512, 4, 2, 64)
    pred = predict_step(prof, work, 2, 1, 1, 0, "1f1b", m, ep=2)
    rows = 2 * 64 * 128 * 4 * 2  # tokens x hidden x fp32 bytes x top_k
    assert pred["ep_s"] == pytest.approx(m * work.layers * 4 * prof.collective_time("all_gather", 2, rows, 2),
                                         rel=ROUNDING)
    ar = prof.collective_time
    dense = (work.layers * work.layer_params + work.end_params) * 4
    sync = ar("all_reduce", 2, dense, 2) + (16 * work.layers - 1) * ar("all_reduce", 2, 0, 2)
    assert pred["dp_s"] == pytest.approx(sync, rel=ROUNDING)
    assert pred["step_s"] == pytest.approx(sum(pred[k] for k in PARTS), rel=ROUNDING)
    # ep 1 over the same 2 replicas: no exchange, the experts' gradients all-reduced with the rest
    flat = predict_step(prof, work, 2, 1, 1, 0, "1f1b", m)
    assert flat["ep_s"] == 0 and flat["dp_s"] > pred["dp_s"]
    with pytest.raises(ValueError, match="no experts"):
        predict_step(prof, WORK, 2, 1, 1, 0, "1f1b", m, ep=2)
