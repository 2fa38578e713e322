"""Planted schedule bugs of the split-backward and V-shaped schedules, as data (each returns a broken copy of a
generated schedule) and as pipeline implementations (suites/pipeline/impls.py) that build and run them."""

from __future__ import annotations

from reference.pipeline import Action, Schedule, generate
from reference.pipeline.schedule import loop_placement


def _copy(s: Schedule, **meta) -> Schedule:
    return Schedule([list(row) for row in s.actions], s.num_stages, s.num_microbatches, s.placement, s.name,
                    {**s.meta, **meta})


def weight_before_input(s: Schedule) -> Schedule:
    """The first W of the schedule moved right before its own I (its output gradient not yet computed)."""
    out = _copy(s)
    for row in out.actions:
        w = next((a for a in row if a and a.kind == "W"), None)
        if w is not None:
            row.remove(w)
            row.insert(row.index(Action(w.stage, "I", w.microbatch)), w)
            return out
    raise ValueError(f"{s.name} has no W to move")


def v_stage_misplaced(s: Schedule) -> Schedule:
    """A V-shaped schedule whose placement says the loop (stage s on rank s mod p): the second stage of every
    rank but the middle one is placed on the wrong rank."""
    return _copy(s) if len(set(s.placement)) == 1 else Schedule(
        [list(row) for row in s.actions], s.num_stages, s.num_microbatches,
        loop_placement(s.num_ranks, s.num_stages), s.name, dict(s.meta))


def premature_overlap(s: Schedule) -> Schedule:
    """A DualPipeV overlapped pair F(a, j) & B(b, k) turned into F(b, k) & B(b, k): the backward runs beside the
    forward whose activation it reads (F(b, k) moved from its own place into the pair, F(a, j) into that place)."""
    out = _copy(s)
    pairs = list(s.meta["overlap"])
    for n, (f, b) in enumerate(pairs):
        own = Action(b.stage, "F", b.microbatch)
        row = next(row for row in out.actions if f in row)
        if own in row and row.index(own) < row.index(f):
            i, k = row.index(own), row.index(f)
            row[i], row[k] = f, own
            pairs[n] = (own, b)
            out.meta["overlap"] = pairs
            return out
    raise ValueError(f"{s.name} has no pair to break")


def planted(name: str, p: int, m: int, v: int, plant) -> Schedule:
    return plant(generate(name, p, m, v))
