"""The contract's learning-rate schedule in torchtitan's terms: its ``LRSchedulersContainer.Config`` (0.3), as a
torchtitan user writes it in the job's ``lr_scheduler`` section.

torchtitan's LambdaLR factor of the 0-based step s: warmup (s + 1) / warmup_steps while s < warmup_steps, then
``stable_steps`` = total + 1 - warmup_steps - decay_steps at the peak, then the decay with progress
(s + 1 - warmup_steps - stable_steps) / decay_steps (components/optimizer/lr_scheduler.py). So its warmup starts at
1 / warmup_steps and ends one update before the contract's with the same number: the contract's (warmup W, start
1 / (W + 1)) is its warmup_steps W + 1; and its peak always lasts at least two updates (the warmup's last, then at
least one stable step): the contract's ``stable`` >= 1 is its own, a decay straight after the warmup (stable 0) it
cannot express. "constant" is its linear decay with min_lr_factor 1."""

from __future__ import annotations

import math


def unsupported(schedule) -> str | None:
    """Why torchtitan's scheduler cannot run ``schedule``, or None."""
    if schedule is None:
        return None
    if schedule.warmup and not math.isclose(schedule.start, 1 / (schedule.warmup + 1), rel_tol=1e-12):
        return (f"torchtitan's warmup starts at 1 / warmup_steps ((step + 1) / warmup_steps): a warmup of "
                f"{schedule.warmup} updates from {schedule.start:g} (not 1 / {schedule.warmup + 1}) is not one it "
                "can be told.")
    if schedule.decay != "constant" and schedule.stable < 1:
        return ("torchtitan holds its peak for at least one step after the warmup (stable_steps >= 1): a decay "
                "starting straight after the warmup (stable 0) is not one it can be told.")
    return None


def fields(schedule) -> tuple[dict, int]:
    """The ``lr_scheduler`` section's fields of ``schedule`` (``unsupported`` None) — the same in 0.2 and 0.3 — and
    its training steps."""
    warmup = schedule.warmup + 1
    if schedule.decay == "constant":
        return {"warmup_steps": warmup, "decay_type": "linear", "min_lr_factor": 1.0}, warmup
    total = schedule.total
    decay_steps = total - schedule.warmup - schedule.stable
    # its decay_steps is round(total x decay_ratio) (decay_steps / total x total is within a rounding of the whole
    # number); None: total - warmup_steps (stable 1)
    ratio = None if schedule.stable == 1 else decay_steps / total
    return {"warmup_steps": warmup, "total_steps": total, "decay_ratio": ratio, "decay_type": schedule.decay,
            "min_lr_factor": schedule.min_ratio}, total


def config(schedule):
    """torchtitan 0.3's ``LRSchedulersContainer.Config`` of ``schedule`` (``unsupported`` None) and its training
    steps."""
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    section, steps = fields(schedule)
    return LRSchedulersContainer.Config(**section), steps


def v02_schedulers(schedule, optimizers, job):
    """torchtitan 0.2's ``build_lr_schedulers`` over ``optimizers`` from ``job``'s ``lr_scheduler`` section (its
    ``JobConfig``) set to ``schedule``'s fields, ``training.steps`` its training steps — as a 0.2 job's TOML sets
    them."""
    from torchtitan.components.lr_scheduler import build_lr_schedulers

    section, steps = fields(schedule)
    for key, value in section.items():
        setattr(job.lr_scheduler, key, value)
    job.training.steps = steps
    return build_lr_schedulers(optimizers, job.lr_scheduler, steps)
