"""The activation-checkpointing contract: wrap a stack of layers so that its activations are recomputed."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

POLICIES = ("layer", "sqrt")


@runtime_checkable
class Checkpointing(Protocol):
    """Activation checkpointing of ``nn.Sequential(*layers)``, one process (no communication)."""

    def wrap(self, layers, policy: str):
        """A module computing ``nn.Sequential(*layers)`` (the same layer objects, so the same parameters)
        with checkpointing under ``policy``: "layer" (each layer checkpointed on its own) or "sqrt" (about
        sqrt(L) contiguous segments, Chen et al. 2016). Its gradients must equal the uncheckpointed
        ones bit for bit, dropout included. Raise ``Unsupported`` for a policy not provided."""
