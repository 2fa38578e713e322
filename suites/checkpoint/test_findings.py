"""torch.utils.checkpoint with use_reentrant=True (torch 2.13), kept under watch: when the checkpointed
segment's input does not require grad (the first segment of a model fed raw data), its parameters get no
gradient — torch only warns — and when nothing before the loss requires grad, backward raises. Minimal
case: checkpoint_sequential of Linear(1, 1) layers in sqrt(L) segments, input without requires_grad.
use_reentrant=False and the reference (whose autograd function takes the parameters as inputs) are
exact here. Reported by the conformance test as a known non-conformance of ``torch-reentrant``."""

from __future__ import annotations

import torch

from harness.adapters.torch.checkpoint import TorchCheckpointing
from harness.checkpoint import case as cases
from reference.checkpoint import ReferenceCheckpointing


def test_reentrant_checkpoint_drops_parameter_gradients_when_the_input_needs_none():
    problems = cases.compare(TorchCheckpointing(use_reentrant=True), "sqrt", 4, 1, 0.0, torch.float32, False, 0)
    missing = [p for p in problems if "gradient missing" in p]
    assert missing and all(p in missing or "after the optimizer step differ" in p for p in problems), problems
    assert cases.compare(TorchCheckpointing(use_reentrant=True), "layer", 1, 1, 0.0, torch.float32, False, 0)[0] \
        .startswith("forward or backward raised")
    for impl in (TorchCheckpointing(use_reentrant=False), ReferenceCheckpointing()):
        assert not cases.compare(impl, "sqrt", 4, 1, 0.0, torch.float32, False, 0)
