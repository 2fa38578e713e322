"""A low-precision recipe as data: for each of a linear layer's three GEMMs, how each operand is cast.

A linear layer y = x W^T (x: tokens x K, W: N x K) runs three GEMMs, each with a reduction dimension:

    output       y  = x  W^T    reduces K:       x over its dim 1,  W over its dim 1
    grad_input   dx = g  W      reduces N:       g over its dim 1,  W over its dim 0
    grad_weight  dW = g^T x     reduces tokens:  g over its dim 0,  x over its dim 0

Every recipe here scales each operand along its GEMM's reduction dimension (what a scaled GEMM can apply after the
products are summed), at one of three granularities:

- ``tensor``: one scale for the whole logical tensor (torchao ``tensorwise``, TransformerEngine's current scaling);
- ``axis``: one scale per row of the GEMM (per index of the other dimension, over the whole reduction dimension:
  torchao ``rowwise``);
- ``block``: one scale per row and per block of ``block`` elements along the reduction dimension (MXFP8: 32, a
  shared power-of-two exponent, OCP MX 1.0's FLOOR rule).

"Whole" means the logical tensor the one device holds: where a layout shards an operand along a dimension its
scale spans, the amax is reduced (max) over the group that shards it; where the shard splits a block, no layout
can compute that block's scale locally and the reference refuses the case. Activations and gradients are the
tensors of one GEMM call (one microbatch on one data-parallel rank): their scales are per call, as torchao and
TransformerEngine compute them; a weight's scale is over the whole weight, whatever shards it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GEMMS = ("output", "grad_input", "grad_weight")
OPERANDS = {  # gemm -> ((operand, the dimension of it the GEMM reduces), ...)
    "output": (("x", 1), ("w", 1)),
    "grad_input": (("g", 1), ("w", 0)),
    "grad_weight": (("g", 0), ("x", 0)),
}
GRANULARITIES = ("tensor", "axis", "block")


@dataclass(frozen=True)
class Cast:
    """How one operand of one GEMM is cast: its float8 ``dtype``, the scale's ``granularity`` and, for ``block``,
    the block length; ``pow2``: the scale rounded down to a power of two (torchao's ``round_scales_to_power_of_2``;
    MX's scales are powers of two by construction)."""

    dtype: torch.dtype
    granularity: str
    pow2: bool = False
    block: int = 32


@dataclass(frozen=True)
class Recipe:
    """A recipe's name and its casts, keyed (gemm, operand)."""

    name: str
    casts: tuple

    def cast(self, gemm: str, operand: str) -> Cast:
        return dict(self.casts)[(gemm, operand)]

    @property
    def block(self) -> int | None:
        """The block length where any cast is blockwise, else None."""
        return next((c.block for _, c in self.casts if c.granularity == "block"), None)


def _recipe(name: str, granularity: str, grad_dtype, pow2: bool) -> Recipe:
    casts = tuple(((gemm, op), Cast(grad_dtype if op == "g" else E4M3, granularity, pow2))
                  for gemm in GEMMS for op, _ in OPERANDS[gemm])
    return Recipe(name, casts)


RECIPES = {
    # torchao Float8LinearRecipeName.TENSORWISE: e4m3 forward, e5m2 gradients, scale = 448 / amax (not rounded)
    "float8-tensorwise": _recipe("float8-tensorwise", "tensor", E5M2, pow2=False),
    # torchao Float8LinearRecipeName.ROWWISE: e4m3 everywhere, scales rounded down to powers of two
    "float8-rowwise": _recipe("float8-rowwise", "axis", E4M3, pow2=True),
    # MXFP8 (torchao mx_formats, emulated): e4m3 elements, one e8m0 exponent per 32 along the reduction dimension
    "mxfp8": _recipe("mxfp8", "block", E4M3, pow2=True),
}


def recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown low-precision recipe {name!r}; known: {', '.join(RECIPES)}.") from None
