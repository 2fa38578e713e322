"""The layouts that change a recipe's scales, and the reference's linear layer in each.

``Layout(kind, sp, fp8_all_gather)`` over a data-parallel group of dp ranks and a tensor-parallel group of tp:

- ``replicated``: the whole weight on every rank (data parallelism; dp x tp with tp = 1);
- ``column``: W's rows (N) split over TP; x whole (``sp``: x's tokens split, all-gathered before the GEMM, the input
  gradient reduce-scattered back); y's columns split;
- ``row``: W's columns (K) split over TP, x's columns with them; the partial outputs all-reduced (``sp``:
  reduce-scattered over the tokens, the upstream gradient all-gathered for the backward);
- ``fsdp``: W flattened and split over DP in equal shards (padded where N K is not a multiple of dp), all-gathered
  for the forward, its gradient reduce-scattered; ``fp8_all_gather``: each rank casts its own shard with the whole
  weight's scale (local amaxes max-reduced over DP first) and the all-gather moves float8 bytes — tensorwise
  scaling only (a row's amax would span shards), as torchao's.

Every rank's calls are its own microbatches; gradients accumulate in ``weight.grad`` (float32) and are summed over DP
by ``full_grad``. The planted bugs of ``suites/low_precision/planted.py`` are keyword arguments here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reference.errors import Unsupported
from reference.tensor_parallel import mappings

from .linear import scaled_linear
from .quantise import amax, cast_operand, dequantise, reduced
from .recipe import OPERANDS, Recipe

KINDS = ("replicated", "column", "row", "fsdp")
SHARDED_DIM = {  # kind -> {operand: the dimension TP shards it along}
    "column": {"w": 0, "g": 1},
    "row": {"w": 1, "x": 1},
}


@dataclass(frozen=True)
class Layout:
    kind: str = "replicated"
    sp: bool = False
    fp8_all_gather: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {self.kind!r}.")
        if self.sp and self.kind not in ("column", "row"):
            raise ValueError(f"sequence parallelism is tensor parallelism's (column, row); the {self.kind} layout "
                             "has none.")
        if self.fp8_all_gather and self.kind != "fsdp":
            raise ValueError(f"the float8 all-gather is FSDP's (the fsdp layout); the {self.kind} layout gathers no "
                             "weight.")

    def label(self) -> str:
        return self.kind + ("-sp" if self.sp else "") + ("-fp8ag" if self.fp8_all_gather else "")


def amax_groups(recipe: Recipe, layout: Layout, tp_group, tp: int, shape: tuple[int, int]) -> dict:
    """(gemm, operand) -> the group each amax is max-reduced over: the TP group where TP shards the operand along a
    dimension its scale spans (the whole tensor, or the GEMM's reduction dimension for an axis scale); a block scale
    never spans shards — a block the shard boundary would split is refused (ValueError)."""
    if tp == 1 or layout.kind not in SHARDED_DIM:
        return {}
    out = {}
    for gemm, operands in OPERANDS.items():
        for name, dim in operands:
            sharded = SHARDED_DIM[layout.kind].get(name)
            if sharded is None:
                continue
            cast = recipe.cast(gemm, name)
            if cast.granularity == "tensor" or (cast.granularity == "axis" and sharded == dim):
                out[(gemm, name)] = tp_group
            elif cast.granularity == "block" and sharded == dim:
                length = shape[1] if layout.kind == "row" else shape[0]
                if (length // tp) % cast.block:
                    raise ValueError(f"{recipe.name}'s blocks of {cast.block} along {'KN'[layout.kind == 'column']} "
                                     f"would straddle the {tp} tensor-parallel shards of {length // tp}: the shard "
                                     f"must be a multiple of {cast.block}.")
    return out


class _FlatShard(torch.autograd.Function):
    """The full weight from this rank's flat shard: all-gathered (``gather``), or — the float8 all-gather, which moves
    no high-precision weight — a placeholder whose values nobody reads. Backward: the full weight's gradient
    reduce-scattered (summed) into the shard's."""

    @staticmethod
    def forward(ctx, shard, group, shape, gather: bool):
        ctx.group, ctx.numel = group, math.prod(shape)
        if not gather:
            return shard.new_zeros(shape)
        full = shard.new_empty(shard.numel() * dist.get_world_size(group))
        dist.all_gather_into_tensor(full, shard.detach().contiguous(), group=group)
        return full[: ctx.numel].view(shape)

    @staticmethod
    def backward(ctx, grad):
        n = dist.get_world_size(ctx.group)
        flat = grad.new_zeros(math.ceil(ctx.numel / n) * n)
        flat[: ctx.numel] = grad.reshape(-1)
        out = flat.new_empty(flat.numel() // n)
        dist.reduce_scatter_tensor(out, flat, group=ctx.group)
        return out, None, None, None


class LowPrecisionLinear(torch.nn.Module):
    """A bias-free linear layer (N x K, float32) under ``recipe`` and ``layout``: ``forward(x_local)`` -> this
    rank's y. ``weight`` is this rank's shard (fsdp: flat)."""

    def __init__(self, weight: torch.Tensor, recipe: Recipe, layout: Layout, tp_group, dp_group, *,
                 local_amax: bool = False, amax_over_dp: bool = False, gather_high_precision: bool = False,
                 stale_weight_scale: bool = False):
        super().__init__()
        self.recipe, self.layout, self.tp_group, self.dp_group = recipe, layout, tp_group, dp_group
        self.tp, self.dp = dist.get_world_size(tp_group), dist.get_world_size(dp_group)
        self.shape = tuple(weight.shape)
        n, k = self.shape
        if layout.kind not in KINDS:
            raise Unsupported(f"the reference has no {layout.kind!r} layout (it has {', '.join(KINDS)}).")
        if layout.kind == "fsdp" and self.tp > 1:
            raise Unsupported("the reference's fsdp layout shards over DP only (tp 1).")
        if layout.fp8_all_gather and (layout.kind != "fsdp" or recipe.cast("output", "w").granularity != "tensor"):
            raise Unsupported("the float8 all-gather is the fsdp layout's, with tensorwise scaling only (a row's or a "
                              "block's amax would span shards).")
        if layout.kind in SHARDED_DIM and (n, k)[SHARDED_DIM[layout.kind]["w"]] % self.tp:
            raise ValueError(f"a {n} x {k} weight does not split over {self.tp} tensor-parallel ranks along its "
                             f"{'rows' if layout.kind == 'column' else 'columns'}.")
        self.where = amax_groups(recipe, layout, tp_group, self.tp, self.shape)
        if local_amax:
            self.where = {}
        elif amax_over_dp:
            self.where = dict.fromkeys(self.where, dp_group)
        self.planted = {"stale": {}} if stale_weight_scale else {}
        self.gather_hp = gather_high_precision
        t = dist.get_rank(tp_group)
        with torch.no_grad():
            if layout.kind == "column":
                local = weight.float().chunk(self.tp, 0)[t]
            elif layout.kind == "row":
                local = weight.float().chunk(self.tp, 1)[t]
            elif layout.kind == "fsdp":
                size = math.ceil(n * k / self.dp)
                flat = torch.zeros(size * self.dp, device=weight.device)
                flat[: n * k] = weight.float().reshape(-1)
                local = flat[dist.get_rank(dp_group) * size:][:size]
            else:
                local = weight.float()
        self.weight = torch.nn.Parameter(local.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind, sp, tp_group = self.layout.kind, self.layout.sp, self.tp_group
        if kind == "fsdp":
            return self._fsdp(x)
        if kind == "column":
            x = mappings.gather_from_sequence_region(x, tp_group) if sp else mappings.copy_to_region(x, tp_group)
            return scaled_linear(x, self.weight, self.recipe, self.where, self.planted)
        y = scaled_linear(x, self.weight, self.recipe, self.where, self.planted)
        if kind == "row" and sp and y.shape[0] % self.tp:
            raise ValueError(f"sequence parallelism splits the tokens over the TP ranks: {y.shape[0]} tokens do "
                             f"not split over {self.tp}.")
        if kind == "row":
            return (mappings.reduce_scatter_to_sequence_region(y, tp_group) if sp
                    else mappings.reduce_from_region(y, tp_group))
        return y

    def _fsdp(self, x):
        fp8 = self.layout.fp8_all_gather and not self.gather_hp
        full = _FlatShard.apply(self.weight, self.dp_group, self.shape, not fp8)
        if not fp8:
            return scaled_linear(x, full, self.recipe, {}, self.planted)
        cast = self.recipe.cast("output", "w")
        a = reduced(amax(self.weight, cast, 0), self.dp_group)  # the whole weight's amax (padding is zeros)
        if self.planted:
            a = self.planted["stale"].setdefault(("output", "w"), a)
        q = cast_operand(self.weight, cast, 0, a)[0]
        gathered = torch.empty(q.numel() * self.dp, dtype=torch.uint8, device=q.device)
        dist.all_gather_into_tensor(gathered, q.view(torch.uint8), group=self.dp_group)
        w = dequantise(gathered.view(q.dtype)[: math.prod(self.shape)], a, cast, 0).view(self.shape)
        return scaled_linear(x, full, self.recipe, {}, self.planted, w_ops={"output": w, "grad_input": w})

    def full_grad(self) -> torch.Tensor:
        """The whole weight's gradient summed over DP, on every rank (collective)."""
        return self._whole(self.weight.grad, reduce_dp=True)

    def sgd_step(self, lr: float) -> None:
        """w -= lr dW with the gradient summed over DP (fsdp: its reduce-scatter already did)."""
        grad = self.weight.grad
        if self.layout.kind != "fsdp" and self.dp > 1:
            dist.all_reduce(grad, group=self.dp_group)
        with torch.no_grad():
            self.weight.sub_(lr * grad)
        self.weight.grad = None

    def full_weight(self) -> torch.Tensor:
        return self._whole(self.weight.detach(), reduce_dp=False)

    def _whole(self, local: torch.Tensor, reduce_dp: bool) -> torch.Tensor:
        local = local.detach().clone()
        kind = self.layout.kind
        if kind == "fsdp":
            full = local.new_empty(local.numel() * self.dp)
            dist.all_gather_into_tensor(full, local, group=self.dp_group)
            return full[: math.prod(self.shape)].view(self.shape)
        if reduce_dp and self.dp > 1:
            dist.all_reduce(local, group=self.dp_group)
        if kind in SHARDED_DIM and self.tp > 1:
            dim = SHARDED_DIM[kind]["w"]
            parts = [torch.empty_like(local) for _ in range(self.tp)]
            dist.all_gather(parts, local.contiguous(), group=self.tp_group)
            return torch.cat(parts, dim)
        return local


def local_part(t: torch.Tensor, what: str, layout: Layout, tp: int, t_rank: int) -> torch.Tensor:
    """This TP rank's part of a call's whole ``what`` ("x", "y", "g" — g is shaped as y —, "dx") under ``layout``."""
    kind, sp = layout.kind, layout.sp
    if kind == "column":
        if what in ("y", "g"):
            return t.chunk(tp, 1)[t_rank]
        return t.chunk(tp, 0)[t_rank] if sp else t
    if kind == "row":
        if what in ("x", "dx"):
            return t.chunk(tp, 1)[t_rank]
        return t.chunk(tp, 0)[t_rank] if sp else t
    return t
