"""ZeRO stages 1-3 over a flat, padded parameter buffer; the optimizer spec; measured memory."""

from .accounting import held_bytes
from .flat import FlatParams
from .optim import OptimizerSpec, StepRecipe
from .sharded_optimizer import ShardedOptimizer
from .stage3 import Zero3

__all__ = ["FlatParams", "OptimizerSpec", "ShardedOptimizer", "StepRecipe", "Zero3", "held_bytes"]
