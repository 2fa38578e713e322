"""An activation-checkpointing implementation to copy from: ``torch.utils.checkpoint`` around each
layer (non-reentrant, which restores the RNG state so dropout recomputes the same mask). Run it with

    pytest suites/checkpoint --impl docs.examples.per_layer_checkpointing:PerLayerCheckpointing

The "sqrt" policy is ``Unsupported`` here (reported, not failed).
"""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.contracts import Unsupported


class _PerLayer(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)  # the same layer objects: the same parameters

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return x


class PerLayerCheckpointing:
    """The checkpointing contract (harness/contracts/checkpoint.py), policy "layer"."""

    def wrap(self, layers, policy: str):
        if policy != "layer":
            raise Unsupported(f"this example checkpoints each layer; policy {policy!r} is not provided.")
        return _PerLayer(layers)
