"""Which optimizer a data-parallel / ZeRO trainer builds, and how much state it keeps per parameter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    """"sgd" (with momentum) or "adam"."""
    lr: float
    """Learning rate."""
    momentum: float = 0.9
    """SGD's momentum (its one state tensor per parameter, ``momentum_buffer``)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's betas (state ``exp_avg`` and ``exp_avg_sq``, two tensors per parameter)."""
    eps: float = 1e-8
    """Adam's epsilon."""

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.name!r} is not one of {', '.join(OPTIMIZERS)}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive; got {self.lr}.")

    def build(self, params) -> torch.optim.Optimizer:
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)
        return torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The per-element state tensors (Adam's scalar ``step`` is not one)."""
        return ("momentum_buffer",) if self.name == "sgd" else ("exp_avg", "exp_avg_sq")

    @property
    def extra_state(self) -> tuple[str, ...]:
        """Per-parameter state that is not per element: Adam's ``step`` (the same count for every parameter)."""
        return ("step",) if self.name == "adam" else ()

    def state_bytes_per_param(self, element_size: int) -> int:
        """K of the ZeRO paper for this optimizer in this precision (no separate master copy)."""
        return len(self.state_keys) * element_size


@dataclass(frozen=True)
class StepRecipe:
    """How a data-parallel / ZeRO trainer turns a step's rows into one optimizer step, beyond the plain
    case (one backward, no clipping)."""

    accumulation: int = 1
    """Micro-steps per optimizer step: ``step(x, y)`` splits its rows into this many equal parts, runs
    forward and backward on each with the loss divided by ``accumulation`` (so the micro-steps' gradients
    sum to the slice's mean-loss gradient), and reduces over the group once, after the last."""
    max_grad_norm: float | None = None
    """Clip the reduced gradient's global norm (over the whole model, each element once) to this."""
    norm_type: float = 2.0
    """2 or inf."""
    masked: bool = False
    """Target rows of NaN count nothing (``reference.zero.masked``): the loss is the mean squared error over
    the global batch's counted rows; ``step`` all-reduces its slice's count (``share``) and back-propagates
    each micro-step's summed squared error over its counted rows divided by that share."""

    def share(self, y: torch.Tensor, group=None) -> float | None:
        """masked: this rank's divisor (``reference.zero.masked.share``, a collective over ``group``); else None."""
        if not self.masked:
            return None
        from .masked import share

        return share(y, group)

    def micro_loss(self, out: torch.Tensor, y: torch.Tensor, share: float | None) -> torch.Tensor:
        """A micro-step's loss to back-propagate (its gradients sum, over micro-steps, to the slice's part of
        the step's): ``F.mse_loss / accumulation``; masked, its counted rows' summed squared error / ``share``."""
        if not self.masked:
            return torch.nn.functional.mse_loss(out, y) / self.accumulation
        from .masked import summed_squared_error

        return summed_squared_error(out, y) / share

    def __post_init__(self):
        if not (isinstance(self.accumulation, int) and self.accumulation >= 1):
            raise ValueError(f"accumulation must be a whole number >= 1; got {self.accumulation!r}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive; got {self.max_grad_norm}.")
        if self.norm_type not in (2.0, float("inf")):
            raise ValueError(f"norm_type must be 2 or inf; got {self.norm_type}.")

    def split(self, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-steps' (x, y): equal row blocks (the rows must divide)."""
        if len(x) % self.accumulation:
            raise ValueError(f"{len(x)} rows cannot be split into {self.accumulation} equal micro-steps.")
        return list(zip(x.chunk(self.accumulation), y.chunk(self.accumulation), strict=True))
