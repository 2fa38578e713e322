"""Bytes a rank sends for one call of a low-precision linear layer (``reference.low_precision``): the layout's
activations and weights, and the amaxes a recipe must reduce across the shards — the float8 all-gather's saving
and the scales' price, exactly."""

from __future__ import annotations

import math

from ._checks import choice, whole
from .communication import collective_bytes

AMAX_BYTES = 4
"""An amax is a float32 (the high-precision operand's dtype)."""
_SHARDED = {"column": {"w": 0, "g": 1}, "row": {"w": 1, "x": 1}}
_OPERANDS = {"output": (("x", 1), ("w", 1)), "grad_input": (("g", 1), ("w", 0)), "grad_weight": (("g", 0), ("x", 0))}


def amax_bytes(granularity: str | None, kind: str, tokens: int, k: int, n: int, tp: int) -> dict:
    """{"forward", "backward"}: the amax all-reduces of one call over TP (a scale that spans a shard: the whole tensor,
    or an axis along the GEMM's reduction dimension; a block never does; None, no recipe: none). Each all-reduce
    carries one float32 per scale of this rank's shard."""
    out = {"forward": 0.0, "backward": 0.0}
    if tp == 1 or kind not in _SHARDED or granularity in ("block", None):
        return out
    local = {"x": (tokens, k // tp if kind == "row" else k),
             "w": (n // tp, k) if kind == "column" else (n, k // tp),
             "g": (tokens, n // tp if kind == "column" else n)}
    for gemm, operands in _OPERANDS.items():
        for name, dim in operands:
            sharded = _SHARDED[kind].get(name)
            if sharded is None or (granularity == "axis" and sharded != dim):
                continue
            scales = 1 if granularity == "tensor" else local[name][1 - dim]
            out["forward" if gemm == "output" else "backward"] += collective_bytes("all_reduce", tp,
                                                                                   scales * AMAX_BYTES)
    return out


def low_precision_layer_bytes(kind: str, granularity: str | None, tokens: int, k: int, n: int, *, dp: int = 1,
                              tp: int = 1, sp: bool = False, fp8_all_gather: bool = False, activation_bytes: float = 4,
                              weight_bytes: float = 4) -> dict:
    """{"forward", "backward"} bytes one rank sends for one call (tokens x K in, N out) of the reference layer.

    TP (Megatron's mappings, Shoeybi et al. 2019; Korthikanti et al. 2022 for SP): column — the input gradient
    all-reduced (SP: the input all-gathered, its gradient reduce-scattered); row — the output all-reduced (SP:
    reduce-scattered, the upstream gradient all-gathered); each of tokens x K or tokens x N activations. FSDP
    (Zhao et al. 2023): the weight all-gathered in the forward — ``weight_bytes`` per element, or one with the float8
    all-gather after a max all-reduce of one float32 amax — and its gradient reduce-scattered in float32, over N K
    padded to a multiple of dp. Plus ``amax_bytes``. ``granularity`` None: the layer in high precision, no recipe (the
    baseline: FSDP2 gathering bf16 weights is ``weight_bytes=2``)."""
    choice("kind", kind, ("replicated", "column", "row", "fsdp"))
    choice("granularity", granularity, ("tensor", "axis", "block", None))
    for name, value in (("tokens", tokens), ("k", k), ("n", n), ("dp", dp), ("tp", tp)):
        whole(name, value)
    out = amax_bytes(granularity, kind, tokens, k, n, tp)
    act_x, act_y = tokens * k * activation_bytes, tokens * n * activation_bytes
    if kind == "column" and tp > 1:
        out["forward"] += collective_bytes("all_gather", tp, act_x) if sp else 0.0
        out["backward"] += collective_bytes("reduce_scatter" if sp else "all_reduce", tp, act_x)
    elif kind == "row" and tp > 1:
        out["forward"] += collective_bytes("reduce_scatter" if sp else "all_reduce", tp, act_y)
        out["backward"] += collective_bytes("all_gather", tp, act_y) if sp else 0.0
    elif kind == "fsdp" and dp > 1:
        padded = math.ceil(n * k / dp) * dp
        if fp8_all_gather:
            out["forward"] += (collective_bytes("all_reduce", dp, AMAX_BYTES)
                               + collective_bytes("all_gather", dp, padded))
        else:
            out["forward"] += collective_bytes("all_gather", dp, padded * weight_bytes)
        out["backward"] += collective_bytes("reduce_scatter", dp, padded * 4)
    return out
