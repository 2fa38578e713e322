"""Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): a
checkpointed function keeps only its inputs in forward and recomputes its activations in backward.

- ``checkpoint(fn, *args)``: the autograd function. Forward runs ``fn`` under no_grad, saving the inputs
  and the CPU (and, when the inputs are on CUDA, that device's) RNG state; backward restores that state,
  reruns ``fn`` with grad enabled on detached inputs (dropout draws the same mask) and back-propagates
  through the recomputed graph. The recomputation runs the same ops on the same values: gradients equal
  the uncheckpointed ones bit for bit. Extra compute: one more forward of ``fn``
  (``cost_model.recompute_overhead``: +1/3 of a step with backward = 2 x forward).
- ``checkpoint_sequential(layers, segments=None)``: ``segments`` contiguous segments, each checkpointed
  as a whole; only segment boundaries stay alive, plus one segment's activations during its backward:
  about L/k + k layers' activations, least at k = sqrt(L) (``cost_model.checkpoint_segments``, the
  default).
- ``SelectiveAttention``: Korthikanti et al. 2022's selective recomputation — only the attention core
  (softmax(q k^T) v, the large s^2 activations, cheap to recompute) is checkpointed; the projections'
  activations are kept.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .cost_model import checkpoint_segments


class _Checkpoint(torch.autograd.Function):
    """Inputs: fn, restore_rng, the number of fn's arguments, fn's arguments, then fn's parameters — the
    parameters are inputs so that autograd sees a path to them even when no argument requires grad."""

    @staticmethod
    def forward(ctx, fn, restore_rng, n_args, *inputs):
        args = inputs[:n_args]
        ctx.fn, ctx.restore_rng, ctx.n_params = fn, restore_rng, len(inputs) - n_args
        ctx.cpu_rng = torch.get_rng_state()
        devices = sorted({a.device.index or 0 for a in args if torch.is_tensor(a) and a.is_cuda})
        ctx.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in devices]
        ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
        ctx.slots = [(torch.is_tensor(a), a.requires_grad if torch.is_tensor(a) else a) for a in args]
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = [next(saved).detach().requires_grad_(value) if is_tensor else value for is_tensor, value in ctx.slots]
        if ctx.restore_rng:
            rng_now = torch.get_rng_state()
            cuda_now = [(d, torch.cuda.get_rng_state(d)) for d, _ in ctx.cuda_rng]
            torch.set_rng_state(ctx.cpu_rng)
            for d, state in ctx.cuda_rng:
                torch.cuda.set_rng_state(state, d)
        try:
            with torch.enable_grad():
                out = ctx.fn(*args)
        finally:
            if ctx.restore_rng:  # the caller's RNG continues where it was
                torch.set_rng_state(rng_now)
                for d, state in cuda_now:
                    torch.cuda.set_rng_state(state, d)
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if o.requires_grad and g is not None]
        wrt = [a for a in args if torch.is_tensor(a) and a.requires_grad] + _params(ctx.fn)
        found = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                     if pairs and wrt else [None] * len(wrt))
        arg_grads = [next(found) if torch.is_tensor(a) and a.requires_grad else None for a in args]
        return (None, None, None, *arg_grads, *[next(found) for _ in range(ctx.n_params)])


def _params(fn) -> list[torch.Tensor]:
    return [p for p in fn.parameters() if p.requires_grad] if isinstance(fn, nn.Module) else []


def checkpoint(fn, *args, restore_rng: bool = True):
    """``fn(*args)`` without keeping its activations; recomputed (same RNG) in backward. Parameters of
    ``fn`` (when it is a module) receive their gradients as without checkpointing."""
    return _Checkpoint.apply(fn, restore_rng, len(args), *args, *_params(fn))


class Checkpointed(nn.Module):
    """A module run through ``checkpoint``."""

    def __init__(self, module: nn.Module, restore_rng: bool = True):
        super().__init__()
        self.module, self.restore_rng = module, restore_rng

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.module(*args)
        return checkpoint(self.module, *args, restore_rng=self.restore_rng)


def checkpoint_sequential(layers, segments: int | None = None, restore_rng: bool = True) -> nn.Sequential:
    """``layers`` as ``segments`` contiguous checkpointed segments (default about sqrt(L))."""
    layers = list(layers)
    if not layers:
        raise ValueError("checkpoint_sequential needs at least one layer.")
    k = checkpoint_segments(len(layers)) if segments is None else segments
    if not 1 <= k <= len(layers):
        raise ValueError(f"segments must be between 1 and the number of layers ({len(layers)}); got {k}.")
    size = math.ceil(len(layers) / k)
    return nn.Sequential(*[Checkpointed(nn.Sequential(*layers[i:i + size]), restore_rng)
                           for i in range(0, len(layers), size)])


class SelectiveAttention(nn.Module):
    """Self-attention whose core softmax(q k^T / sqrt(d)) v is recomputed in backward, the projections
    kept (selective recomputation); (batch, seq, hidden) in and out."""

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, heads: int, causal: bool = False):
        super().__init__()
        self.qkv, self.proj, self.heads, self.causal = qkv, proj, heads, causal

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        core = checkpoint(_AttentionCore(self.causal), q, k, v) if torch.is_grad_enabled() else \
            _AttentionCore(self.causal)(q, k, v)
        return self.proj(core.transpose(1, 2).reshape(b, s, h))


class _AttentionCore(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if self.causal:
            s = q.shape[-2]
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class ReferenceCheckpointing:
    """The checkpointing contract (harness/contracts/checkpoint.py) on ``checkpoint``."""

    def __init__(self, restore_rng: bool = True):
        self.restore_rng = restore_rng

    def wrap(self, layers, policy: str) -> nn.Module:
        if policy == "layer":
            return nn.Sequential(*[Checkpointed(layer, self.restore_rng) for layer in layers])
        if policy == "sqrt":
            return checkpoint_sequential(layers, restore_rng=self.restore_rng)
        from .errors import Unsupported

        if policy == "selective":
            raise Unsupported("the reference checkpoints whole layers or segments; selective saving is a "
                              "dispatch-level policy (torch's create_selective_checkpoint_contexts: --impl torch).")
        raise Unsupported(f"policy {policy!r} is not one of layer, sqrt, selective.")
