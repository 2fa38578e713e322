"""Counting the float8 casts a stack's step runs: a stack asked for a float8 / MX recipe that computes its linear
layers in high precision agrees with one device within the precision-matched bound (its error is smaller, not
larger), so the bound alone cannot see it. ``Float8Casts`` (a ``torch.overrides.TorchFunctionMode``, torch's public
API) counts every torch call, in the forward and the backward, that returns a float8 tensor (the cast of an operand:
``Tensor.to`` a float8 dtype, as torchao and ours cast) on this rank; ``least(spec, layout, recipe, steps)`` is the
fewest casts all ranks together must run: each linear layer of each block is called at least once per pipeline pass
on each replica and each tensor-parallel / context-parallel rank, and each call casts at least its two activations
(the input x and the upstream gradient g; the weight's cast may be shared between calls) — twice each where the
recipe scales an operand along each of two GEMMs' reduction dimensions (rowwise, MX)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


class Float8Casts(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype in FLOAT8:
            self.count += 1
        return out


def linears_per_block(spec) -> int:
    from reference.low_precision.convert import block_linears

    return len(block_linears(spec.build(0))) // spec.layers


def casts_per_call(recipe_name: str) -> int:
    """The fewest casts of the two activations a call's three GEMMs need: x (output GEMM along K, grad_weight GEMM
    along the tokens) and g (grad_input along N, grad_weight along the tokens) — one each where one scale serves
    both GEMMs (tensorwise), two each where each GEMM scales along its own reduction dimension."""
    from reference.low_precision import recipe

    return 2 if recipe(recipe_name).cast("output", "x").granularity == "tensor" else 4


def least(spec, layout, recipe, steps: int) -> int:
    return (linears_per_block(spec) * spec.layers * casts_per_call(recipe.low_precision) * recipe.accumulation * steps
            * layout.dp * layout.cp * layout.tp)


def check(per_rank: list, spec, layout, recipe, steps: int) -> str | None:
    """The problem line when the ranks' casts (each rank's result's ``float8_casts``) fall short of ``least``."""
    got = sum(int(r.get("float8_casts", 0)) for r in per_rank if isinstance(r, dict))
    need = least(spec, layout, recipe, steps)
    if got >= need:
        return None
    return (f"float8 casts: {got} over {len(per_rank)} rank(s) in {steps} step(s), fewer than the {need} that "
            f"{linears_per_block(spec)} linear layers x {spec.layers} blocks under {recipe.low_precision} need (each "
            f"call casts its input and its gradient): the stack computed linear layers in high precision")
