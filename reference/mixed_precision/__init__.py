"""Mixed-precision training: the dynamic loss scaler of fp16; data parallelism / ZeRO 0-3 with
low-precision parameters and gradients, fp32 master weights and optimizer state."""

from .scaler import DynamicLossScaler
from .zero import MixedPrecisionZero

__all__ = ["DynamicLossScaler", "MixedPrecisionZero"]
