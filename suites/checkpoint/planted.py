"""Planted bugs behind the checkpointing contract, loaded by spec like a user's implementation."""

import torch
from torch import nn

from reference.checkpoint import ReferenceCheckpointing


class NoRngRestore(ReferenceCheckpointing):
    """Planted bug: recomputation does not restore the RNG state, so recomputed dropout draws new masks."""

    def __init__(self):
        super().__init__(restore_rng=False)


class _RecomputeFromSavedRng(torch.autograd.Function):
    """Recomputes with the forward's RNG state, and leaves the global RNG there afterwards."""

    @staticmethod
    def forward(ctx, layer, state, x, *params):
        ctx.layer, ctx.state = layer, state
        ctx.save_for_backward(x)
        with torch.no_grad():
            return layer(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        torch.set_rng_state(ctx.state)  # the bug: the caller's RNG state is never put back
        x = x.detach().requires_grad_(ctx.needs_input_grad[2])
        with torch.enable_grad():
            out = ctx.layer(x)
        wrt = ([x] if x.requires_grad else []) + list(ctx.layer.parameters())
        found = list(torch.autograd.grad(out, wrt, grad, allow_unused=True))
        x_grad = found.pop(0) if x.requires_grad else None
        return (None, None, x_grad, *found)


class _LeakyLayers(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = _RecomputeFromSavedRng.apply(layer, torch.get_rng_state(), x, *layer.parameters())
        return x


class LeavesRngAdvanced:
    """Planted bug: recomputation replays the right dropout masks (one step is bitwise right) but leaves
    the caller's RNG stream where the recomputation stopped, so the next step draws other masks."""

    def wrap(self, layers, policy):
        return _LeakyLayers(layers)


class SelectiveIgnored:
    """Planted bug: asked "selective", checkpoints whole layers — the policy silently not applied (TRL PR 6280's
    review): the same gradients, every matmul recomputed."""

    def wrap(self, layers, policy):
        from harness.adapters.torch.checkpoint import TorchCheckpointing

        return TorchCheckpointing().wrap(layers, "layer" if policy == "selective" else policy)


class SavesEverything:
    """Planted bug: asked "selective", saves the activations too (the matmuls' and the GELU's outputs; only dropout's
    in-place draw is replayed) — nearly nothing recomputed, no memory saved."""

    def wrap(self, layers, policy):
        import functools

        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        from harness.adapters.torch.checkpoint import TorchCheckpointing, _PerLayer

        if policy != "selective":
            return TorchCheckpointing().wrap(layers, policy)
        import torch

        saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.gelu.default}
        context = functools.partial(create_selective_checkpoint_contexts, lambda ctx, op, *a, **k:
                                    CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE)
        return _PerLayer(layers, False, context)
