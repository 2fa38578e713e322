"""The schedules of 2026 as data: ZB-V and DualPipeV (two stages per rank in a V) and interleaved zero bubble
validate, simulate without deadlock, meet the papers' closed forms exactly at the papers' settings, hold the
activations the papers state, and their planted bugs are rejected by the validator (and deadlock the simulator
where they would read what is not computed yet)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.cost_model import bubble_fraction
from reference.pipeline import DeadlockError, ScheduleError, generate, simulate, validate

from .planted_schedules import premature_overlap, v_stage_misplaced, weight_before_input
from .test_schedules import validates_and_simulates

P, M = st.integers(1, 8), st.integers(1, 24)
NEW = ("zbv", "dualpipev", "interleaved-zb")


def whole_rounds(p: int, m: int) -> bool:
    return m % max(1, m // p) == 0


@settings(max_examples=200)
@given(st.sampled_from(NEW), P, M, st.integers(1, 3))
def test_every_generated_schedule_validates_and_simulates(name, p, m, v):
    if name == "interleaved-zb" and not whole_rounds(p, m):
        with pytest.raises(ValueError, match="whole rounds"):
            generate(name, p, m, v)
        return
    schedule = generate(name, p, m, v)
    validates_and_simulates(schedule)
    for row in schedule.actions:  # every I has its W on its rank, after it: all done before the optimizer step
        assert all(row.index(a) < row.index(type(a)(a.stage, "W", a.microbatch)) for a in row if a.kind == "I")


def test_the_v_placement():
    """Rank r holds stages r and 2p - 1 - r: the first and the last stage share rank 0, the middle two rank p - 1
    (a stage's successor on the same rank), and every action runs where its stage lives."""
    for p in range(1, 9):
        for name in ("zbv", "dualpipev"):
            s = generate(name, p, 2 * p)
            assert s.placement == tuple(range(p)) + tuple(reversed(range(p))) and s.num_stages == 2 * p
            assert s.placement[0] == s.placement[-1] == 0 and s.placement[p - 1] == s.placement[p] == p - 1
            for r, row in enumerate(s.actions):
                assert {a.stage for a in row} == {r, 2 * p - 1 - r}


def test_closed_forms_on_the_whole_grid():
    """The cost model's bubble (reference/cost_model/pipeline.py) is the simulator's, exactly (up to float
    division), at unit costs: ZB-V at every m, DualPipeV at m >= 2p, interleaved ZB at m a multiple of p."""
    for p in range(1, 9):
        for m in range(1, 25):
            for name, v in (("zbv", 1), ("dualpipev", 1), ("interleaved-zb", 1), ("interleaved-zb", 2),
                            ("interleaved-zb", 3)):
                if (name == "dualpipev" and m < 2 * p) or (name == "interleaved-zb" and m % p):
                    continue
                got = simulate(generate(name, p, m, v)).bubble_fraction
                assert got == pytest.approx(bubble_fraction(name, p, m, v), abs=1e-12), (name, p, m, v)


@pytest.mark.parametrize("w", [1.0, 0.5, 3.0])
def test_zbv_has_no_bubble_within_a_rank_and_1f1b_memory(w):
    """The zero-bubble paper, section 6: with F = I = W (any unit), ZB-V leaves no rank idle between its first and
    its last action (its lead-in and tail overlap the optimizer step), and holds 2p half-size stage activations
    per rank: 1F1B's p full stages. From m = 2p - 1 on (the schedule's own warm-up)."""
    costs = {"F": w, "I": w, "W": w, "B": 2 * w}
    for p in range(1, 9):
        for m in range(2 * p - 1, 2 * p + 4):
            t = simulate(generate("zbv", p, m), costs)
            assert t.idle_within == [0.0] * p and t.peak_in_flight == [2 * p] * p, (p, m)


def test_dualpipev_meets_deepseeks_table():
    """deepseek-ai/DualPipe's table (the DeepSeek-V3 report's, cut in half): with PP = 2p stages, rank 0's bubble
    is (PP/2 - 1)(F&B + B - 3W) and every rank holds PP + 1 stage activations. Exact at F = I = W with no overlap
    gain (F&B = F + B); with a gain (F&B < F + B) the table's bubble is an upper bound, which the simulated rank 0
    meets."""
    for p in range(1, 9):
        for m in range(2 * p, 2 * p + 4):
            s = generate("dualpipev", p, m)
            exact = simulate(s)
            assert exact.idle_within[0] == (p - 1) * (3 + 2 - 3) == max(exact.idle_within), (p, m)
            assert exact.peak_in_flight == [2 * p + 1] * p, (p, m)
            for fb in (2.0, 2.5, 2.75):
                t = simulate(s, {"F&B": fb})
                assert max(t.idle_within) == t.idle_within[0] <= (p - 1) * (fb + 2 - 3), (p, m, fb)
                assert t.makespan < exact.makespan or p == 1 and m <= 2 * p  # the overlap's gain shortens the step


def test_overlapped_pairs_are_a_forward_and_the_other_stages_backward():
    for p in range(2, 7):
        s = generate("dualpipev", p, 3 * p)
        assert s.meta["overlap"]
        for f, b in s.meta["overlap"]:
            row = s.actions[s.placement[f.stage]]
            assert row[row.index(f) + 1] == b and f.kind == "F" and b.kind == "B" and f.stage != b.stage


def test_planted_weight_before_its_input_is_rejected():
    for name in ("zbv", "interleaved-zb", "zb-h1"):
        with pytest.raises(ScheduleError) as info:
            validate(weight_before_input(generate(name, 3, 6, 2 if name == "interleaved-zb" else 1)))
        assert info.value.rule == "I before W", (name, str(info.value))


def test_planted_v_stage_on_the_wrong_rank_is_rejected():
    for name in ("zbv", "dualpipev"):
        with pytest.raises(ScheduleError, match="placement: .* belongs on rank"):
            validate(v_stage_misplaced(generate(name, 3, 6)))


def test_planted_premature_overlap_is_rejected_and_deadlocks():
    broken = premature_overlap(generate("dualpipev", 3, 6))
    with pytest.raises(ScheduleError) as info:
        validate(broken)
    assert info.value.rule == "an overlapped backward does not need its own pair's forward", str(info.value)
    with pytest.raises(DeadlockError):  # run together, the backward waits on its own forward forever
        simulate(broken)
