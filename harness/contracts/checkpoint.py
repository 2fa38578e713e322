"""The activation-checkpointing contract: wrap a stack of layers so that its activations are recomputed."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

POLICIES = ("layer", "sqrt", "selective")
SAVED_BY_SELECTIVE = ("aten.mm", "aten.addmm")
"""The ops whose outputs the "selective" policy saves (each layer's matrix multiplications); it recomputes the rest."""


@runtime_checkable
class Checkpointing(Protocol):
    """Activation checkpointing of ``nn.Sequential(*layers)``, one process (no communication)."""

    def wrap(self, layers, policy: str):
        """A module computing ``nn.Sequential(*layers)`` (the same layer objects, so the same parameters)
        with checkpointing under ``policy``: "layer" (each layer checkpointed on its own), "sqrt" (about
        sqrt(L) contiguous segments, Chen et al. 2016) or "selective" (each layer checkpointed, the outputs of its
        matrix multiplications — ``SAVED_BY_SELECTIVE`` — saved and everything else recomputed: torch's
        ``create_selective_checkpoint_contexts`` with MUST_SAVE for them, PREFER_RECOMPUTE otherwise). Its
        gradients must equal the uncheckpointed ones bit for bit, dropout included, and its backward must recompute
        what the policy says: every layer's forward ops under "layer", none of the saved ops and every other one
        under "selective" (counted). Raise ``Unsupported`` for a policy not provided."""
