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
