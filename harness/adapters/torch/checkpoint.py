"""The ``torch`` and ``torch-reentrant`` checkpointing implementations: ``torch.utils.checkpoint``'s
``checkpoint`` per layer and ``checkpoint_sequential`` with about sqrt(L) segments, with
use_reentrant=False (the recommended default) or True (the legacy autograd-function implementation); selective
checkpointing (``create_selective_checkpoint_contexts``: the matmuls saved) per layer, non-reentrant only."""

from __future__ import annotations

from torch import nn

from harness.contracts import Unsupported
from reference.cost_model import checkpoint_segments


def selective_context():
    """torch's selective-checkpoint context for the contract's "selective" policy: the matrix multiplications'
    outputs (mm, addmm, bmm) MUST_SAVE, every other op PREFER_RECOMPUTE."""
    import functools

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class _PerLayer(nn.Module):
    def __init__(self, layers, use_reentrant: bool, context_fn=None):
        super().__init__()
        self.layers, self.use_reentrant, self.context_fn = nn.ModuleList(layers), use_reentrant, context_fn

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        extra = {"context_fn": self.context_fn} if self.context_fn is not None else {}
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=self.use_reentrant, **extra)
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
        if policy == "selective":
            if self.use_reentrant:
                raise Unsupported("selective checkpointing (context_fn) needs use_reentrant=False; the reentrant "
                                  "checkpoint recomputes whole segments.")
            return _PerLayer(layers, False, selective_context())
        raise Unsupported(f"policy {policy!r} is not one of layer, sqrt, selective.")
