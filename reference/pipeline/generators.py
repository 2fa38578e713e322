"""Schedule generators. Each returns a compute-only ``Schedule`` (lower it with ``add_send_recv``).

Bubble (idle fraction with unit costs F = I = W = 1, B = 2, no latency) is in each docstring and is
what ``reference.cost_model.bubble_fraction`` returns; a property holds the simulator to both.
"""

from __future__ import annotations

from .schedule import Action, Schedule, loop_placement, v_placement
from .schedule import check_counts as _check
from .splitting import split_backward
from .vshape import dualpipev, zbv


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (all forwards, then all backwards). Bubble (p - 1)/(m + p - 1); holds m microbatches."""
    _check(p, m)
    rows = [[Action(r, "F", j) for j in range(m)] + [Action(r, "B", j) for j in range(m)] for r in range(p)]
    return Schedule(rows, p, m, loop_placement(p, p), "gpipe")


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: rank r runs min(p - r - 1, m) warm-up forwards, then alternates one forward and one
    backward, then drains the backwards. Bubble (p - 1)/(m + p - 1), as GPipe, but rank r holds at most
    p - r microbatches in flight instead of m (Narayanan et al. 2021, PipeDream-Flush)."""
    _check(p, m)
    rows = []
    for r in range(p):
        warm = min(p - r - 1, m)
        row = [Action(r, "F", j) for j in range(warm)]
        for i in range(m - warm):
            row += [Action(r, "F", warm + i), Action(r, "B", i)]
        row += [Action(r, "B", j) for j in range(m - warm, m)]
        rows.append(row)
    return Schedule(rows, p, m, loop_placement(p, p), "1f1b")


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2; Megatron-LM's order): v model chunks per
    rank, stage c*p + r on rank r, microbatches in rounds of g: g = p when m is a multiple of p, else (torch's
    flexible rounds) g = m / max(1, m // p), which must divide m (m < p is one round of m). Bubble
    (p - 1)/(v m + p - 1) when m is a multiple of p: the warm-up and drain shrink v-fold because each chunk is
    1/v of the rank's layers; other m have the simulator's bubble."""
    _check(p, m, v)
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"interleaved 1F1B needs m in whole rounds: m={m} is not a multiple of {rounds} rounds "
                         f"(p={p}); take m < 2p or a multiple of p.")
    g = m // rounds
    total = m * v

    def unit(k: int, forward: bool) -> tuple[int, int]:
        """(chunk, microbatch) of the k-th forward (or backward) on a rank."""
        in_group = k % (g * v)
        chunk = in_group // g if forward else v - 1 - in_group // g
        return chunk, (k // (g * v)) * g + k % g

    rows = []
    for r in range(p):
        warm = min((p - r - 1) * 2 + (v - 1) * g, total)

        def fwd(k: int, r: int = r) -> Action:
            chunk, j = unit(k, True)
            return Action(chunk * p + r, "F", j)

        def bwd(k: int, r: int = r) -> Action:
            chunk, j = unit(k, False)
            return Action(chunk * p + r, "B", j)

        row = [fwd(k) for k in range(warm)]
        for i in range(total - warm):
            row += [fwd(warm + i), bwd(i)]
        row += [bwd(k) for k in range(total - warm, total)]
        rows.append(row)
    return Schedule(rows, p * v, m, loop_placement(p, p * v), f"interleaved(v={v})", {"v": v})


def zb_h1(p: int, m: int) -> Schedule:
    """Zero-bubble H1 (Qi et al. 2023): the backward split into I (input gradient, on the critical path)
    and W (weight gradient, deferrable). Rank r runs 1F1B's forwards and I's (at most p - r forwards
    ahead of their I, 1F1B's activation bound), fills what would be idle time with W's, and defers at
    most p - 1 of them, so at most 2p - 1 - r microbatches wait for their W, whatever m. Built by
    list-scheduling those priorities on unit costs. Bubble (p - 1)/(3m + p - 1) for m >= p, a third of
    1F1B's bubble time; ``reference.cost_model.bubble_fraction`` gives m < p."""
    _check(p, m)
    f_end: dict[tuple[int, int], float] = {}
    i_end: dict[tuple[int, int], float] = {}
    rows: list[list[Action]] = [[] for _ in range(p)]
    free = [0.0] * p
    next_f, next_i, w_todo = [0] * p, [0] * p, [[] for _ in range(p)]
    for _ in range(3 * m * p):
        best = None  # (start, priority, rank, kind): the earliest startable action over all ranks
        for r in range(p):
            options = [(free[r], 2, "W")] if w_todo[r] else []
            if len(w_todo[r]) <= p - 1:  # else this rank must catch up on its W's first
                j = next_f[r]
                if j < m and next_f[r] - next_i[r] < p - r and (r == 0 or (r - 1, j) in f_end):
                    options.append((max(free[r], f_end.get((r - 1, j), 0.0)), 1, "F"))
                j = next_i[r]
                if j < next_f[r] and (r == p - 1 or (r + 1, j) in i_end):
                    options.append((max(free[r], i_end.get((r + 1, j), 0.0)), 0, "I"))
            for start, prio, kind in options:  # at a tie I, then F, then W: a W only fills a gap
                if best is None or (start, prio, r) < best[:3]:
                    best = (start, prio, r, kind)
        start, _, r, kind = best
        if kind == "F":
            j = next_f[r]
            f_end[(r, j)] = start + 1.0
            next_f[r] += 1
        elif kind == "I":
            j = next_i[r]
            i_end[(r, j)] = start + 1.0
            next_i[r] += 1
            w_todo[r].append(j)
        else:
            j = w_todo[r].pop(0)
        rows[r].append(Action(r, kind, j))
        free[r] = start + 1.0
    return Schedule(rows, p, m, loop_placement(p, p), "zb-h1")


def interleaved_zb(p: int, m: int, v: int) -> Schedule:
    """Interleaved zero bubble (ZB1P over v chunks; torch's ``ScheduleInterleavedZeroBubble``): interleaved 1F1B's
    forwards and input-gradient backwards in its order, each W deferred into the idle time the split opens
    (``splitting.split_backward``), at most p - 1 W's waiting per rank, as in ZB-H1. Needs m a multiple of p, as
    interleaved 1F1B does. Its bubble is the simulator's (no paper gives a closed form)."""
    _check(p, m, v)
    return split_backward(interleaved_1f1b(p, m, v), p - 1, f"interleaved-zb(v={v})")


GENERATORS = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b, "zb-h1": zb_h1,
              "interleaved-zb": interleaved_zb, "zbv": zbv, "dualpipev": dualpipev}
SPLIT_BACKWARD = ("zb-h1", "interleaved-zb", "zbv", "dualpipev")
"""The schedules whose backward is split into I and W actions (dualpipev splits only its drain's second half)."""
FUSED_BACKWARD = tuple(name for name in GENERATORS if name not in SPLIT_BACKWARD)
INTERLEAVED = ("interleaved", "interleaved-zb")
"""The schedules that take ``v`` (model chunks per rank) and place stage c * p + r on rank r."""
V_SHAPED = ("zbv", "dualpipev")
"""Two stages per rank in a V: stage r and 2p - 1 - r on rank r."""


def stages_per_rank(name: str, v: int = 1) -> int:
    """How many stages each rank holds: ``v`` for the interleaved schedules, 2 for the V-shaped, else 1."""
    return 2 if name in V_SHAPED else v if name in INTERLEAVED else 1


def placement(name: str, p: int, v: int = 1) -> tuple[int, ...]:
    """placement[s] is the rank that holds stage s under the named schedule: a V for the V-shaped schedules,
    s mod p otherwise."""
    return v_placement(p) if name in V_SHAPED else loop_placement(p, p * stages_per_rank(name, v))


def generate(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The named schedule; ``v`` (model chunks per rank) is the interleaved schedules' only."""
    if name not in GENERATORS:
        raise ValueError(f"schedule must be one of {', '.join(GENERATORS)}; got {name!r}.")
    return GENERATORS[name](p, m, v) if name in INTERLEAVED else GENERATORS[name](p, m)
