"""The one-device recipe: a linear layer whose three GEMMs consume operands cast by a ``Recipe``, emulated (the
operands dequantised to float64, the GEMM in float64 — within the fp32 accumulation of a real scaled GEMM, and the
same operands in any layout give the same sums but for their order).

``gemm_operands`` casts one GEMM's two operands; ``where`` says over which process group each (gemm, operand)'s amax
is max-reduced (missing or None: the tensor is whole on this rank). ``ScaledLinear`` is the autograd function every
layout runs: y = x W^T in the forward, dx and dW from the upstream gradient in the backward, each GEMM's operands
cast by the recipe; its outputs take the input's dtype (float32: torchao's, a scaled GEMM's output dtype).
"""

from __future__ import annotations

import torch

from .quantise import amax, cast_operand, reduced
from .recipe import OPERANDS, Recipe


def operand(t: torch.Tensor, recipe: Recipe, gemm: str, name: str, where: dict | None = None,
            planted: dict | None = None) -> torch.Tensor:
    """The float64 operand ``name`` of GEMM ``gemm``: ``t`` cast with its amax reduced over ``where[(gemm, name)]``."""
    dim = dict(OPERANDS[gemm])[name]
    cast = recipe.cast(gemm, name)
    group = (where or {}).get((gemm, name))
    a = reduced(amax(t, cast, dim), group)
    if planted and planted.get("stale") is not None and name == "w":  # a scale kept from an earlier call
        a = planted["stale"].setdefault((gemm, name), a)
    return cast_operand(t, cast, dim, a)[1]


class ScaledLinear(torch.autograd.Function):
    """y = x W^T under ``recipe``; x (tokens, K), w (N, K). ``w_ops``: the weight's float64 operands of the output
    and grad_input GEMMs where the caller already cast it (the float8 all-gather), else None."""

    @staticmethod
    def forward(ctx, x, w, recipe: Recipe, where: dict, planted: dict, w_ops):
        ctx.recipe, ctx.where, ctx.planted, ctx.w_ops = recipe, where, planted, w_ops
        ctx.save_for_backward(x, w)
        wo = w_ops["output"] if w_ops else operand(w, recipe, "output", "w", where, planted)
        return (operand(x, recipe, "output", "x", where, planted) @ wo.T).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        r, where, planted = ctx.recipe, ctx.where, ctx.planted
        wi = ctx.w_ops["grad_input"] if ctx.w_ops else operand(w, r, "grad_input", "w", where, planted)
        dx = operand(g, r, "grad_input", "g", where, planted) @ wi
        dw = operand(g, r, "grad_weight", "g", where, planted).T @ operand(x, r, "grad_weight", "x", where, planted)
        return dx.to(x.dtype), dw.to(torch.float32), None, None, None, None


def scaled_linear(x: torch.Tensor, w: torch.Tensor, recipe: Recipe, where: dict | None = None,
                  planted: dict | None = None, w_ops: dict | None = None) -> torch.Tensor:
    return ScaledLinear.apply(x, w, recipe, where or {}, planted or {}, w_ops)


def one_device(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, recipe: Recipe) -> dict:
    """The recipe on one device, for one call: {"y", "dx", "dw"} in float64 (no rounding to the output dtype), and
    their magnitudes {"|y|", "|dx|", "|dw|"}: each GEMM of the absolute values of its operands — the sum of
    |terms| that bounds a reordered sum's error (Higham: |fl(sum) - sum| <= n u sum |terms|)."""
    xo, wo = operand(x, recipe, "output", "x"), operand(w, recipe, "output", "w")
    gi, wi = operand(g, recipe, "grad_input", "g"), operand(w, recipe, "grad_input", "w")
    gw, xw = operand(g, recipe, "grad_weight", "g"), operand(x, recipe, "grad_weight", "x")
    return {"y": xo @ wo.T, "dx": gi @ wi, "dw": gw.T @ xw,
            "|y|": xo.abs() @ wo.abs().T, "|dx|": gi.abs() @ wi.abs(), "|dw|": gw.abs().T @ xw.abs()}
