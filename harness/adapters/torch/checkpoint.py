"""The ``torch`` and ``torch-reentrant`` checkpointing implementations: ``torch.utils.checkpoint``'s
``checkpoint`` per layer and ``checkpoint_sequential`` with about sqrt(L) segments, with
use_reentrant=False (the recommended default) or True (the legacy autograd-function implementation)."""

from __future__ import annotations

from torch import nn

from harness.contracts import Unsupported
from reference.cost_model import checkpoint_segments


class _PerLayer(nn.Module):
    def __init__(self, layers, use_reentrant: bool):
        super().__init__()
        self.layers, self.use_reentrant = nn.ModuleList(layers), use_reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=self.use_reentrant)
        return x


class _Sequential(nn.Module):
    def __init__(self, layers, use_reentrant: bool):
        super().__init__()
        self.layers, self.use_reentrant = nn.Sequential(*layers), use_reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint_sequential

        return checkpoint_sequential(self.layers, checkpoint_segments(len(self.layers)), x,
                                     use_reentrant=self.use_reentrant)


class TorchCheckpointing:
    def __init__(self, use_reentrant: bool = False):
        self.use_reentrant = use_reentrant

    def wrap(self, layers, policy: str):
        if policy == "layer":
            return _PerLayer(layers, self.use_reentrant)
        if policy == "sqrt":
            return _Sequential(layers, self.use_reentrant)
        raise Unsupported(f"policy {policy!r} is not one of layer, sqrt.")
