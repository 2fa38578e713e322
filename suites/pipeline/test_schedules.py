"""Pipeline schedules as data: every generator's schedule validates, simulates without deadlock, and has
exactly the bubble the cost model states; corrupted schedules are rejected or reported as deadlock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.cost_model import bubble_fraction
from reference.pipeline import (
    Action,
    DeadlockError,
    ScheduleError,
    add_send_recv,
    generate,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    simulate,
    validate,
    zb_h1,
)
from reference.pipeline.schedule import KINDS, Schedule, loop_placement

P, M, V = st.integers(1, 8), st.integers(1, 24), st.integers(1, 4)
MANY = settings(max_examples=300)


@MANY
@given(st.integers(0, 99), st.sampled_from(KINDS), st.integers(0, 999))
def test_action_text_round_trips(stage, kind, mb):
    a = Action(stage, kind, mb)
    assert Action.parse(str(a)) == a and str(a) == f"{stage}{kind}{mb}"


@pytest.mark.parametrize("text", ["F0", "2X0", "1SEND0", "-1F0", "2F"])
def test_action_parse_rejects_garbage(text):
    with pytest.raises(ValueError, match="is not an action"):
        Action.parse(text)


def generated(name: str, p: int, m: int, v: int):
    if name == "interleaved":
        return interleaved_1f1b(p, m * p, v)  # m a multiple of p, as the schedule requires
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}[name](p, m)


@MANY
@given(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1"]), P, M, V)
def test_every_generated_schedule_validates_and_simulates(name, p, m, v):
    validates_and_simulates(generated(name, p, m, v))


def validates_and_simulates(schedule) -> None:
    """The schedule and its lowering validate and simulate; sends and receives cost nothing at zero latency."""
    validate(schedule)
    lowered = add_send_recv(schedule)
    validate(lowered)
    base = simulate(schedule)
    assert simulate(lowered).makespan == base.makespan  # sends and receives cost nothing here
    assert simulate(schedule, {"comm": 0.25}).makespan >= base.makespan


@MANY
@given(st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1"]), P, M, V)
def test_simulated_bubble_equals_the_cost_model(name, p, m, v):
    """reference.cost_model.bubble_fraction is the analytic oracle; the simulator must agree exactly
    (up to float division: 1e-12) with unit costs F = I = W = 1, B = 2 and no latency."""
    schedule = generated(name, p, m, v)
    mb = schedule.num_microbatches
    want = bubble_fraction(name, p, mb, v if name == "interleaved" else 1)
    assert simulate(schedule).bubble_fraction == pytest.approx(want, abs=1e-12), (name, p, mb, v)


def test_bubble_agreement_on_the_whole_grid():
    """The same agreement on every p <= 8, m <= 16 (and v <= 3 for interleaved), not only sampled points."""
    for p in range(1, 9):
        for m in range(1, 17):
            for name in ("gpipe", "1f1b", "zb-h1"):
                got = simulate(generated(name, p, m, 1)).bubble_fraction
                assert got == pytest.approx(bubble_fraction(name, p, m), abs=1e-12), (name, p, m)
            if m % p == 0:
                for v in (1, 2, 3):
                    got = simulate(interleaved_1f1b(p, m, v)).bubble_fraction
                    assert got == pytest.approx(bubble_fraction("interleaved", p, m, v), abs=1e-12), (p, m, v)


@MANY
@given(P, M)
def test_activation_memory_gpipe_m_1f1b_p(p, m):
    g, o, z = simulate(gpipe(p, m)), simulate(one_f_one_b(p, m)), simulate(zb_h1(p, m))
    assert g.peak_in_flight[0] == m
    assert all(peak == min(p - r, m) for r, peak in enumerate(o.peak_in_flight))
    assert all(peak <= min(2 * p - 1 - r, m) for r, peak in enumerate(z.peak_in_flight))


def _swap(row, a: str, b: str):
    i, k = row.index(Action.parse(a)), row.index(Action.parse(b))
    row[i], row[k] = row[k], row[i]


def test_swapped_forward_and_backward_is_rejected():
    s = one_f_one_b(3, 4)
    _swap(s.actions[2], "2F1", "2B1")
    with pytest.raises(ScheduleError) as info:
        validate(s)
    assert info.value.rule == "F before its backward" and info.value.rank == 2
    assert ">>2B1<<" in str(info.value)


def test_duplicated_microbatch_is_rejected():
    s = gpipe(2, 3)
    s.actions[1][1] = Action(1, "F", 0)
    with pytest.raises(ScheduleError, match="each action exactly once: 1F0 appears again"):
        validate(s)


def test_missing_backward_is_rejected():
    s = gpipe(2, 2)
    s.actions[0].pop()
    with pytest.raises(ScheduleError, match="backward once per microbatch"):
        validate(s)


def test_dropped_send_is_rejected_and_deadlocks():
    s = add_send_recv(one_f_one_b(3, 4))
    s.actions[0] = [a for a in s.actions[0] if str(a) != "0SEND_F2"]
    with pytest.raises(ScheduleError, match="1RECV_F2 has no 0SEND_F2"):
        validate(s)
    with pytest.raises(DeadlockError) as info:
        simulate(s)
    assert info.value.waiting[1][0] == Action.parse("1RECV_F2")


def test_cross_rank_wait_cycle_is_a_deadlock_not_a_hang():
    rows = [[Action.parse(t) for t in ["0F0", "0B0", "0F1", "0B1"]],
            [Action.parse(t) for t in ["1F0", "1F1", "1B0", "1B1"]]]
    s = Schedule(rows, 2, 2, loop_placement(2, 2), "bad")
    validate(s)  # locally every rule holds
    with pytest.raises(DeadlockError, match="rank 0 waits at 0B0 for 1B0; rank 1 waits at 1F1 for 0F1"):
        simulate(s)


def test_wrong_placement_is_rejected():
    s = gpipe(2, 1)
    s.actions[0][0], s.actions[1][0] = s.actions[1][0], s.actions[0][0]
    with pytest.raises(ScheduleError, match="placement: 1F0 belongs on rank 1"):
        validate(s)


def _overlap(pair_of):
    """DualPipeV at p 2, m 4 with its first overlapped pair (forward, backward) replaced by ``pair_of(f, b)``."""
    s = generate("dualpipev", 2, 4)
    pairs = list(s.meta["overlap"])
    return Schedule(s.actions, s.num_stages, s.num_microbatches, s.placement, s.name,
                    {**s.meta, "overlap": [pair_of(*pairs[0]), *pairs[1:]]})


def _with(s, change):
    change(s.actions)
    return s


@pytest.mark.parametrize("broken, said", [
    (lambda: Schedule(gpipe(2, 1).actions, 2, 1, (0, 2), "bad"),
     "placement (0, 2) must give a rank in 0..1 for each of 2 stages."),
    (lambda: _with(gpipe(2, 2), lambda rows: rows[0].append(Action(0, "F", 2))),
     "unknown stage or microbatch: 0F2 is outside stages 0..1, microbatches 0..1 (rank 0, step 4)"),
    (lambda: _with(gpipe(2, 2), lambda rows: rows[0].remove(Action(0, "F", 1))),
     "every stage runs F once per microbatch: 0F1 is missing (rank 0)"),
    (lambda: _overlap(lambda f, b: (b, f)),
     "an overlapped pair is a forward and a backward: (3B1, 0F3) is not a forward and a backward of this schedule "
     "(rank 0)"),
    (lambda: _overlap(lambda f, b: (f, Action(0, "B", 0))),  # a backward of that rank, not next to the forward
     "an overlapped pair runs as one unit: 0B0 is not right after 0F3 (rank 0, step 10)"),
], ids=["placement-out-of-range", "unknown-microbatch", "missing-F", "pair-not-F-and-B", "pair-not-adjacent"])
def test_a_schedule_breaking_a_rule_is_refused_naming_the_rule_and_where(broken, said):
    """The validator is what keeps a broken schedule from being run (and hanging): each rule refused in its words,
    at its rank and step, before anything is sent."""
    with pytest.raises(ValueError) as info:
        validate(broken())
    assert str(info.value).splitlines()[0] == said


@pytest.mark.parametrize("call, message", [
    (lambda: gpipe(2, 0), "m must be a whole number >= 1; got 0"),
    (lambda: one_f_one_b(0, 4), "p must be a whole number >= 1; got 0"),
    (lambda: interleaved_1f1b(2, 4, 0), "v must be a whole number >= 1; got 0"),
    (lambda: interleaved_1f1b(4, 9, 2), "m in whole rounds: m=9 is not a multiple of 2 rounds"),
])
def test_impossible_requests_name_the_rule(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_latency_and_costs_enter_the_makespan():
    # GPipe, p = 2, m = 1, F = 1, B = 2, latency 0.5 each way: F, hop, F, B, hop, B.
    assert simulate(gpipe(2, 1), {"comm": 0.5}).makespan == 1 + 0.5 + 1 + 2 + 0.5 + 2
