"""Simulate a schedule: per-action start/end times, makespan, bubble, in-flight microbatches.

Each rank runs its list in order; an action starts when its rank is free and its inputs are ready:

    F(s, j)      after F(s-1, j)                       (+ latency when s-1 is on another rank)
    B/I(s, j)    after F(s, j) and B/I(s+1, j)         (+ latency when s+1 is on another rank)
    W(s, j)      after I(s, j)
    RECV_F(s, j) after SEND_F(s-1, j) + latency;  RECV_B(s, j) after SEND_B(s+1, j) + latency

In a lowered schedule (with SEND/RECV actions) a compute takes its cross-rank input from the RECV
before it instead. A schedule in which no rank can make progress raises ``DeadlockError`` naming the
stuck ranks and what each waits for: the simulation never loops forever.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schedule import Action, Schedule

DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "comm": 0.0}


class DeadlockError(RuntimeError):
    """No rank can make progress; ``waiting`` maps each stuck rank to (its next action, what it needs)."""

    def __init__(self, waiting: dict[int, tuple[Action, list[Action]]]):
        self.waiting = waiting
        parts = [f"rank {r} waits at {a} for {', '.join(map(str, needs))}" for r, (a, needs) in waiting.items()]
        super().__init__("deadlock: " + "; ".join(parts) + ".")


@dataclass
class Timeline:
    """What ``simulate`` returns: per rank [(action, start, end)] and the metrics."""

    events: list[list[tuple[Action, float, float]]]
    makespan: float
    bubble_fraction: float
    """idle / (ranks * makespan)."""
    peak_in_flight: list[int]
    """Per rank, most stage activations held: forwards done whose backward (B, or W) is not."""
    idle_within: list[float]
    """Per rank, idle time between its first start and its last end: the bubble as the zero-bubble paper and
    DualPipe's table count it (a rank's lead-in before its first input arrives, and its tail after its last
    W, overlap the optimizer step and the next iteration; the makespan's bubble fraction counts them)."""


def _backward_kind(schedule: Schedule) -> dict[tuple[int, int], str]:
    kinds = {}
    for row in schedule.actions:
        for a in row:
            if a and a.kind in ("B", "I"):
                kinds[(a.stage, a.microbatch)] = a.kind
    return kinds


def dependencies(a: Action, schedule: Schedule, lowered: bool, bwd: dict) -> list[tuple[Action, bool]]:
    """(action it needs, crosses ranks) pairs."""
    s, j, place, last = a.stage, a.microbatch, schedule.placement, schedule.num_stages - 1
    deps: list[tuple[Action, bool]] = []
    if a.kind == "F" and s > 0:
        cross = place[s - 1] != place[s]
        deps.append((Action(s, "RECV_F", j), False) if cross and lowered else (Action(s - 1, "F", j), cross))
    elif a.kind in ("B", "I"):
        deps.append((Action(s, "F", j), False))
        if s < last:
            cross = place[s + 1] != place[s]
            nxt = Action(s + 1, bwd.get((s + 1, j), "B"), j)
            deps.append((Action(s, "RECV_B", j), False) if cross and lowered else (nxt, cross))
    elif a.kind == "W":
        deps.append((Action(s, "I", j), False))
    elif a.kind == "SEND_F":
        deps.append((Action(s, "F", j), False))
    elif a.kind == "SEND_B":
        deps.append((Action(s, bwd.get((s, j), "B"), j), False))
    elif a.kind == "RECV_F":
        deps.append((Action(s - 1, "SEND_F", j), True))
    elif a.kind == "RECV_B":
        deps.append((Action(s + 1, "SEND_B", j), True))
    return deps


def simulate(schedule: Schedule, costs: dict | None = None) -> Timeline:
    """Run the schedule on a model of the machine with per-kind ``costs`` (F, B, I, W, comm latency).

    A key ``(stage, kind)`` overrides the kind's cost for that stage (stages of unequal work); in a lowered
    schedule SEND_*/RECV_* may be costed too (what posting a message occupies its rank for), else they
    take no time. ``comm`` is the latency added to every cross-rank dependency. An overlapped pair
    (``meta["overlap"]``, adjacent on its rank) starts when both its actions' inputs are ready and both end
    together after ``F&B`` (default: the two costs added; DualPipe's F&B is what overlapping saves); a
    backward that needs its own pair's forward can never start (a deadlock, named)."""
    c = {**DEFAULT_COSTS, **(costs or {})}
    lowered = bool(schedule.meta.get("lowered"))
    bwd = _backward_kind(schedule)
    partner = dict(schedule.meta.get("overlap", ()))
    rows = [[a for a in row if a is not None] for row in schedule.actions]
    end: dict[Action, float] = {}
    nxt = [0] * len(rows)
    free = [0.0] * len(rows)
    events: list[list[tuple[Action, float, float]]] = [[] for _ in rows]
    remaining = sum(len(r) for r in rows)
    while remaining:
        progressed = False
        for r, row in enumerate(rows):
            while nxt[r] < len(row):
                a = row[nxt[r]]
                pair = [a, row[nxt[r] + 1]] if partner.get(a) in row[nxt[r] + 1:nxt[r] + 2] else [a]
                deps = [d for x in pair for d in dependencies(x, schedule, lowered, bwd)]
                if any(d not in end for d, _ in deps):
                    break
                start = max([free[r]] + [end[d] + (c["comm"] if cross else 0.0) for d, cross in deps])
                own = [c.get((x.stage, x.kind), c.get(x.kind, 0.0)) for x in pair]  # sends, receives: 0 unless costed
                total = c.get("F&B", sum(own)) if len(pair) == 2 else own[0]
                at = start
                for x, cost in zip(pair, own, strict=True):  # drawn in proportion; both done at the pair's end
                    share = total * cost / sum(own) if sum(own) else 0.0
                    events[r].append((x, at, at + share))
                    at += share
                for x in pair:
                    end[x] = start + total
                free[r] = start + total
                nxt[r] += len(pair)
                remaining -= len(pair)
                progressed = True
        if not progressed:
            waiting = {}
            for r, row in enumerate(rows):
                if nxt[r] < len(row):
                    a = row[nxt[r]]
                    pair = [a, row[nxt[r] + 1]] if partner.get(a) in row[nxt[r] + 1:nxt[r] + 2] else [a]
                    waiting[r] = (a, [d for x in pair for d, _ in dependencies(x, schedule, lowered, bwd)
                                      if d not in end])
            raise DeadlockError(waiting)
    makespan = max(free, default=0.0)
    busy = [sum(e - s for _, s, e in row) for row in events]
    bubble = 1 - sum(busy) / (len(rows) * makespan) if makespan > 0 else 0.0
    within = [(row[-1][2] - row[0][1]) - b if row else 0.0 for row, b in zip(events, busy, strict=True)]
    return Timeline(events, makespan, bubble, [_peak_in_flight(row, bwd) for row in events], within)


def _peak_in_flight(row, bwd) -> int:
    """Activations held: +1 at a forward's end, -1 at its backward's end (W when split, else B)."""
    changes = []
    for a, _, finish in row:
        if a.kind == "F":
            changes.append((finish, 1))
        elif a.kind == "B" or a.kind == "W":
            changes.append((finish, -1))
    level = peak = 0
    for _, delta in sorted(changes, key=lambda x: (x[0], x[1])):  # frees before allocations at a tie
        level += delta
        peak = max(peak, level)
    return peak
