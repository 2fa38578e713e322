"""The learning-rate schedule a trainer runs: each update's learning rate as a factor of the optimizer's ``lr``.

The position is ``s``, the number of updates already taken (torch's ``LRScheduler.last_epoch`` during the update,
Megatron's ``num_steps`` in iterations): update 1 trains at ``factor(0)``. An update a loss scaler skips is not
taken — the schedule does not advance (Megatron, DeepSpeed and accelerate step their schedulers only after an
applied update). Linear warmup from ``start`` over ``warmup`` updates, then (WSD) ``stable`` updates at the peak,
then the decay to ``min_ratio`` reached at s = ``total`` and kept after:

    s < warmup:                       start + (1 - start) s / warmup
    warmup <= s <= warmup + stable:   1                      (and always, for decay "constant")
    up to total:                      min + (1 - min) c(p),  p = (s - warmup - stable) / (total - warmup - stable)
    s >= total:                       min_ratio

with c(p) = 1 - p ("linear") or (1 + cos(pi p)) / 2 ("cosine"). Megatron's ``OptimizerParamScheduler`` is this
function of its ``num_steps`` (init_lr = start x lr, its WSD style for ``stable``); each other stack's convention
maps onto it (harness/adapters/*: where one cannot express it, the stack says so in a sentence)."""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAYS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    warmup: int = 0
    """Updates of linear warmup (0: none)."""
    start: float = 0.0
    """The warmup's first factor (update 1's learning rate is start x lr; 0: it moves nothing, Megatron's default)."""
    stable: int = 0
    """Updates at the peak after the warmup before the decay begins (warmup-stable-decay)."""
    decay: str = "constant"
    """"constant", "linear" or "cosine"."""
    total: int | None = None
    """The position the decay reaches ``min_ratio`` at (a decay needs it; "constant" takes none)."""
    min_ratio: float = 0.0
    """The decay's floor, as a fraction of lr."""

    def __post_init__(self):
        for name in ("warmup", "stable"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number of updates >= 0; got {value!r}.")
        if self.decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {self.decay!r}.")
        for name in ("start", "min_ratio"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a fraction of lr: between 0 and 1; got {value!r}.")
        if self.decay == "constant":
            if self.total is not None or self.stable or self.min_ratio:
                raise ValueError("a constant schedule (after its warmup) has no total, stable or min_ratio: they "
                                 "shape a decay (decay 'linear' or 'cosine').")
        elif not isinstance(self.total, int) or self.total <= self.warmup + self.stable:
            raise ValueError(f"a {self.decay} decay needs total (the update it reaches min_ratio at) greater than "
                             f"warmup + stable = {self.warmup + self.stable}; got {self.total!r}.")

    @property
    def decay_begins(self) -> int:
        """The position the decay starts from (its factor still 1)."""
        return self.warmup + self.stable

    def factor(self, s: int) -> float:
        """The learning rate of the update taken after ``s`` updates, as a fraction of lr."""
        if s < self.warmup:
            return self.start + (1.0 - self.start) * s / self.warmup
        if self.decay == "constant" or s <= self.decay_begins:
            return 1.0
        if s >= self.total:
            return self.min_ratio
        p = (s - self.decay_begins) / (self.total - self.decay_begins)
        c = 1.0 - p if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        return self.min_ratio + (1.0 - self.min_ratio) * c


def set_lr(optimizers, factor: float) -> None:
    """Each parameter group of ``optimizers`` at ``factor`` x its own base lr (kept under "initial_lr", as torch's
    schedulers keep it): what a scheduler does before an update."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor


class Scheduled:
    """The schedule applied to a trainer's optimizers: ``before_update`` sets each group's lr for the update about to
    be taken; ``taken`` counts the updates applied (call ``after_update`` after each; a skipped one is not)."""

    def __init__(self, schedule: LRSchedule | None):
        self.schedule, self.taken = schedule, 0

    @property
    def factor(self) -> float:
        """The next update's learning rate as a fraction of lr (1 without a schedule)."""
        return self.schedule.factor(self.taken) if self.schedule is not None else 1.0

    def before_update(self, optimizers) -> None:
        if self.schedule is not None:
            set_lr(optimizers, self.factor)

    def after_update(self) -> None:
        self.taken += 1
