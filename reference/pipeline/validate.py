"""Validate a schedule's structure before anything runs; cross-rank progress is the simulator's job
(``simulate`` raises ``DeadlockError`` for a schedule whose ranks wait on each other forever)."""

from __future__ import annotations

from collections import Counter

from .schedule import Action, Schedule


class ScheduleError(ValueError):
    """A broken rule, with the rank, the step, and that rank's timeline with the step marked."""

    def __init__(self, rule: str, schedule: Schedule, rank: int, step: int | None, detail: str):
        self.rule, self.rank, self.step = rule, rank, step
        row = schedule.actions[rank] if 0 <= rank < schedule.num_ranks else []
        cells = [f">>{a or '.'}<<" if i == step else str(a or ".") for i, a in enumerate(row)]
        where = f"rank {rank}" + (f", step {step}" if step is not None else "")
        super().__init__(f"{rule}: {detail} ({where})\n  rank {rank}: " + " ".join(cells))


def _positions(schedule: Schedule) -> dict[Action, tuple[int, int]]:
    pos: dict[Action, tuple[int, int]] = {}
    for r, row in enumerate(schedule.actions):
        for i, a in enumerate(row):
            if a is not None:
                pos.setdefault(a, (r, i))
    return pos


def validate(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` unless every rule holds:

    - every action's stage and microbatch exist, and it runs on the rank that holds its stage;
    - every stage runs F and its backward (B, or I and W) exactly once per microbatch;
    - on a rank, F(s, j) comes before its I/B, I before W; F(s-1, j) before F(s, j) and the backward
      of s+1 before that of s when both stages live on the same rank;
    - every SEND has exactly one matching RECV (SEND_F(s, j) <-> RECV_F(s+1, j), SEND_B(s, j) <->
      RECV_B(s-1, j)), each after/before the compute it carries on its own rank;
    - an overlapped pair (``meta["overlap"]``: a forward and a backward run as one unit, DualPipe's F&B) is
      a forward then a backward, adjacent on one rank, and the backward does not need the pair's own forward
      (B(s, j) needs F(s', j) for every s' >= s): run together, it would read an activation before its
      forward finished.
    """
    S, M, place = schedule.num_stages, schedule.num_microbatches, schedule.placement
    if len(place) != S or any(not 0 <= r < schedule.num_ranks for r in place):
        raise ValueError(f"placement {place} must give a rank in 0..{schedule.num_ranks - 1} for each of {S} stages.")
    counts = Counter()
    for r, row in enumerate(schedule.actions):
        for i, a in enumerate(row):
            if a is None:
                continue
            if not (0 <= a.stage < S and 0 <= a.microbatch < M):
                raise ScheduleError("unknown stage or microbatch", schedule, r, i,
                                    f"{a} is outside stages 0..{S - 1}, microbatches 0..{M - 1}")
            if place[a.stage] != r:
                raise ScheduleError("placement", schedule, r, i, f"{a} belongs on rank {place[a.stage]}")
            counts[a] += 1
            if counts[a] > 1:
                raise ScheduleError("each action exactly once", schedule, r, i, f"{a} appears again")
    pos = _positions(schedule)
    for s in range(S):
        for j in range(M):
            f, b, ii, w = (Action(s, k, j) for k in "FBIW")
            r = place[s]
            if f not in pos:
                raise ScheduleError("every stage runs F once per microbatch", schedule, r, None, f"{f} is missing")
            if (b in pos) == (ii in pos) or (ii in pos) != (w in pos):
                raise ScheduleError("every stage runs its backward once per microbatch (B, or I and W)",
                                    schedule, r, None, f"stage {s} microbatch {j} has "
                                    f"{[str(x) for x in (b, ii, w) if x in pos] or 'no backward'}")
            back = b if b in pos else ii
            _before(schedule, pos, f, back, "F before its backward")
            if w in pos:
                _before(schedule, pos, ii, w, "I before W")
            if s > 0 and place[s - 1] == r:
                _before(schedule, pos, Action(s - 1, "F", j), f, "stage order of forwards")
            if s < S - 1 and place[s + 1] == r:
                nb = Action(s + 1, "B", j) if Action(s + 1, "B", j) in pos else Action(s + 1, "I", j)
                _before(schedule, pos, nb, back, "backwards in reverse stage order")
    _check_comm(schedule, pos)
    _check_overlap(schedule, pos)


def _before(schedule, pos, first: Action, then: Action, rule: str) -> None:
    if first in pos and then in pos and pos[first][0] == pos[then][0] and pos[first][1] > pos[then][1]:
        r, i = pos[then]
        raise ScheduleError(rule, schedule, r, i, f"{then} runs before {first}")


def _check_comm(schedule: Schedule, pos) -> None:
    partner = {"SEND_F": ("RECV_F", 1), "SEND_B": ("RECV_B", -1), "RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", 1)}
    for a, (r, i) in pos.items():
        if a.kind not in partner:
            continue
        kind, shift = partner[a.kind]
        other = Action(a.stage + shift, kind, a.microbatch)
        if other not in pos:
            raise ScheduleError("each send has its matching receive", schedule, r, i, f"{a} has no {other}")
        compute = Action(a.stage, "F", a.microbatch)
        if a.kind in ("SEND_B", "RECV_B"):
            b = Action(a.stage, "B", a.microbatch)
            compute = b if b in pos else Action(a.stage, "I", a.microbatch)
        if a.kind.startswith("SEND"):
            _before(schedule, pos, compute, a, "send after the compute it carries")
        else:
            _before(schedule, pos, a, compute, "receive before the compute that needs it")


def _check_overlap(schedule: Schedule, pos) -> None:
    for f, b in schedule.meta.get("overlap", ()):
        if f not in pos or b not in pos or f.kind != "F" or b.kind not in ("B", "I"):
            r = pos.get(f, pos.get(b, (0, None)))[0]
            raise ScheduleError("an overlapped pair is a forward and a backward", schedule, r, None,
                                f"({f}, {b}) is not a forward and a backward of this schedule")
        (r, i), (rb, k) = pos[f], pos[b]
        row = schedule.actions[r]
        between = [a for a in row[i + 1:k] if a is not None and a.kind not in ("RECV_B", "RECV_F")]
        if rb != r or k < i or between:
            raise ScheduleError("an overlapped pair runs as one unit", schedule, rb, k, f"{b} is not right after {f}")
        if f.microbatch == b.microbatch and f.stage >= b.stage:
            raise ScheduleError("an overlapped backward does not need its own pair's forward", schedule, r, k,
                                f"{b} needs {f}'s activation, which is still being computed beside it")
