"""Low-precision training recipes (float8 tensorwise / rowwise, MXFP8) as data, emulated: ``recipe`` (what each
GEMM's operands are cast to and how each scale is computed), ``quantise`` (scales, casts, the amax reduction),
``linear`` (the one-device recipe: a linear layer's three scaled GEMMs), ``layout`` (TP column / row, sequence
parallelism, FSDP with or without the float8 all-gather: where each amax must be reduced). Every communicating
function takes its group."""

from .layout import KINDS, Layout, LowPrecisionLinear, amax_groups, local_part
from .linear import ScaledLinear, one_device, operand, scaled_linear
from .quantise import amax, cast_operand, dequantise
from .recipe import GEMMS, OPERANDS, RECIPES, Cast, Recipe, recipe


class ReferenceLowPrecision:
    """The ``low_precision`` contract over ``LowPrecisionLinear``."""

    description = "ours: emulated float8 / MXFP8 linear (TP column / row, SP, FSDP with the float8 all-gather)"

    def __init__(self, **planted):
        self.planted = planted

    def shard(self, weight, recipe_name: str, layout: Layout, tp_group, dp_group):
        return LowPrecisionLinear(weight, recipe(recipe_name), layout, tp_group, dp_group, **self.planted)

    def full_grad(self, module, tp_group, dp_group):
        return module.full_grad()

    def sgd_step(self, module, lr, tp_group, dp_group):
        module.sgd_step(lr)

    def full_weight(self, module, tp_group, dp_group):
        return module.full_weight()


__all__ = ["GEMMS", "KINDS", "OPERANDS", "RECIPES", "Cast", "Layout", "LowPrecisionLinear", "Recipe",
           "ReferenceLowPrecision", "ScaledLinear", "amax", "amax_groups", "cast_operand", "dequantise", "local_part",
           "one_device", "operand", "recipe", "scaled_linear"]
