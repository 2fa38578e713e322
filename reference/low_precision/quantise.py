"""Quantise with a recipe's scale and dequantise, emulated: the float8 values are torch's float8 dtypes (round to
nearest even, saturated to the format's largest finite value), the dequantised operand is float64 — so that the GEMM
that consumes it adds no rounding the recipe does not have, and two layouts that cast the same tensor with the same
scale give bit-identical operands.

Scales follow torchao 0.18: float8 (``tensor`` / ``axis``) scale = finfo.max / max(amax, 1e-12), computed in float64
and stored as float32, optionally rounded down to a power of two; q = saturate(x * scale) in float32; the operand
q / scale. MX (``block``, OCP MX 1.0 FLOOR): the e8m0 exponent floor(log2(amax)) - emax of the element format
(8 for e4m3), read off amax's float32 exponent bits as torchao does; q = saturate(x / 2^exponent); the operand
q * 2^exponent. Every amax is exact (a maximum rounds nothing), so a max-reduction over the group that shards a
tensor gives the one device's amax bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .recipe import Cast

EPS = 1e-12
"""torchao's floor under an amax (an all-zero tensor's scale stays finite)."""
_EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}
"""The largest power of two of each element format (OCP MX: emax_elem)."""


def _blocked(t: torch.Tensor, dim: int, block: int) -> torch.Tensor:
    """``t`` (2-D) with ``dim`` moved last and split into (length / block, block)."""
    moved = t.movedim(dim, -1)
    if moved.shape[-1] % block:
        raise ValueError(f"a dimension of {moved.shape[-1]} does not split into blocks of {block}.")
    return moved.reshape(*moved.shape[:-1], moved.shape[-1] // block, block)


def _unblocked(b: torch.Tensor, dim: int) -> torch.Tensor:
    return b.reshape(*b.shape[:-2], -1).movedim(-1, dim)


def amax(t: torch.Tensor, cast: Cast, dim: int) -> torch.Tensor:
    """The amax(es) ``cast`` scales ``t`` by when a GEMM reduces ``t``'s dimension ``dim``: a 0-d tensor
    (``tensor``), one per index of the other dimension (``axis``, keepdim), or one per row and block (``block``,
    shaped as ``_blocked``'s with a trailing 1)."""
    a = t.detach().abs()
    if cast.granularity == "tensor":
        return a.max()
    if cast.granularity == "axis":
        return a.amax(dim=dim, keepdim=True)
    return _blocked(a, dim, cast.block).amax(dim=-1, keepdim=True)


def reduced(a: torch.Tensor, group) -> torch.Tensor:
    """``a`` max-reduced over ``group`` (None: as it is)."""
    if group is not None:
        a = a.clone()
        dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
    return a


def float8_scale(a: torch.Tensor, cast: Cast) -> torch.Tensor:
    """torchao's ``amax_to_scale``: finfo.max / max(amax, EPS) in float64, stored as float32 (power of two: rounded
    down)."""
    scale = (torch.finfo(cast.dtype).max / torch.clamp(a.double(), min=EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if cast.pow2 else scale


def mx_exponent(a: torch.Tensor, cast: Cast) -> torch.Tensor:
    """OCP MX FLOOR: the shared exponent floor(log2(amax)) - emax, from amax's float32 exponent bits (torchao's
    ``to_mx``; a zero or subnormal block: -127), clamped to e8m0's range."""
    bits = a.float().contiguous().view(torch.int32)
    unbiased = ((bits >> 23) & 0xFF) - 127
    return torch.clamp(unbiased - _EMAX[cast.dtype], min=-127, max=128)


def saturate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    big = torch.finfo(dtype).max
    return x.clamp(min=-big, max=big).to(dtype)


def dequantise(q: torch.Tensor, a: torch.Tensor, cast: Cast, dim: int) -> torch.Tensor:
    """The float64 operand of ``q`` (cast with amax ``a``): q / scale, or for a block q * 2^exponent."""
    if cast.granularity != "block":
        return q.double() / float8_scale(a, cast).double()
    step = torch.exp2(mx_exponent(a, cast).double()).clamp(min=2.0**-126)
    return _unblocked(_blocked(q.double(), dim, cast.block) * step, dim)


def cast_operand(t: torch.Tensor, cast: Cast, dim: int, a: torch.Tensor | None = None):
    """(q, the float64 operand) of ``t`` under ``cast`` for a GEMM reducing ``dim``, scaled by amax ``a`` (None:
    ``t``'s own: ``amax(t, cast, dim)``)."""
    a = amax(t, cast, dim) if a is None else a
    if cast.granularity != "block":
        q = saturate(t.detach().float() * float8_scale(a, cast), cast.dtype)
    else:  # torchao's to_mx: x / the block's float32 factor (at least the smallest normal), saturated
        step = torch.exp2(mx_exponent(a, cast).float()).clamp(min=2.0**-126)
        q = _unblocked(saturate(_blocked(t.detach().float(), dim, cast.block) / step, cast.dtype), dim)
    return q, dequantise(q, a, cast, dim)
