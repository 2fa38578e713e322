"""ZeRO stages 1-3 over a flat, padded parameter buffer; the optimizer spec; measured memory."""

from .accounting import held_bytes
from .flat import FlatParams
from .lr_schedule import LRSchedule, Scheduled, set_lr
from .optim import OptimizerSpec, StepRecipe
from .sharded_optimizer import ShardedOptimizer
from .stage3 import Zero3

__all__ = ["FlatParams", "LRSchedule", "Scheduled", "set_lr",
           "OptimizerSpec", "ShardedOptimizer", "StepRecipe", "Zero3", "held_bytes"]
