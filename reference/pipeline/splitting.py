"""Split a fused schedule's backwards into I and W: the zero-bubble transformation (Qi et al. 2024).

Each rank keeps its forwards and input-gradient backwards in the fused schedule's order (the critical path)
and runs a deferred weight gradient whenever its next F or I could not start yet; at most ``max_deferred``
W's wait (each holds its stage's activations), the rest drain at the end. Built by list-scheduling on unit
costs (F = I = W = 1), as ``zb_h1`` is.
"""

from __future__ import annotations

from .schedule import Action, Schedule
from .simulate import dependencies


def split_backward(fused: Schedule, max_deferred: int, name: str) -> Schedule:
    """``fused`` with every B replaced by I and its W placed into the idle time that B's shortening opens."""
    order = [[Action(a.stage, "I" if a.kind == "B" else a.kind, a.microbatch) for a in row if a is not None]
             for row in fused.actions]
    shape = Schedule(order, fused.num_stages, fused.num_microbatches, fused.placement)
    bwd = {(a.stage, a.microbatch): "I" for row in order for a in row if a.kind == "I"}
    end: dict[Action, float] = {}
    rows: list[list[Action]] = [[] for _ in order]
    free, nxt, waiting = [0.0] * len(order), [0] * len(order), [[] for _ in order]
    total = sum(2 * len(row) - sum(a.kind == "F" for a in row) for row in order)
    while sum(len(row) for row in rows) < total:
        best = None  # (start, priority, rank, action): the earliest startable action over all ranks
        for r, row in enumerate(order):
            options = [(free[r], 1, waiting[r][0])] if waiting[r] else []
            if nxt[r] < len(row) and len(waiting[r]) <= max_deferred:
                a = row[nxt[r]]
                deps = [d for d, _ in dependencies(a, shape, False, bwd)]
                if all(d in end for d in deps):
                    options.append((max([free[r]] + [end[d] for d in deps]), 0, a))
            for start, prio, a in options:  # at a tie the F or I; a W only fills a gap
                if best is None or (start, prio, r) < best[:3]:
                    best = (start, prio, r, a)
        if best is None:
            raise ValueError(f"{fused.name or 'the fused schedule'} cannot be split: its ranks wait on each other.")
        start, _, r, a = best
        if a.kind == "W":
            waiting[r].pop(0)
        else:
            nxt[r] += 1
            if a.kind == "I":
                waiting[r].append(Action(a.stage, "W", a.microbatch))
        end[a] = start + 1.0
        free[r] = start + 1.0
        rows[r].append(a)
    return Schedule(rows, fused.num_stages, fused.num_microbatches, fused.placement, name, dict(fused.meta))
