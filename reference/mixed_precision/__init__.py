"""Mixed-precision training pieces: the dynamic loss scaler of fp16."""

from .scaler import DynamicLossScaler

__all__ = ["DynamicLossScaler"]
