"""The analytic cost model: memory, communication and bubble, as exact documented formulas.

Units are bytes (reports print GB = 1e9 bytes, as the papers do) and seconds. Every function cites its
source. Later suites compare their measurements against these predictions, so they are oracles.
"""

from .communication import (
    alpha_beta_time,
    busbw_factor,
    collective_bytes,
    dp_step_comm_bytes,
    hsdp_step_comm_bytes,
    tp_layer_comm_bytes,
)
from .context import CP_ALGORITHMS, cp_activation_memory, cp_layer_comm_bytes
from .expert import balanced_ep_bytes, ep_layer_comm_bytes, expert_params
from .low_precision import amax_bytes, low_precision_layer_bytes
from .memory import OFFLOAD_MIN_STAGE, OFFLOADS, MemoryBreakdown, activation_memory, offloaded_memory, training_memory
from .muon import muon_step_bytes
from .pipeline import bubble_fraction
from .recompute import checkpoint_segments, recompute_overhead, sqrt_checkpoint_memory

__all__ = [
    "CP_ALGORITHMS", "balanced_ep_bytes", "cp_activation_memory", "cp_layer_comm_bytes", "ep_layer_comm_bytes",
    "amax_bytes", "expert_params", "low_precision_layer_bytes", "muon_step_bytes",
    "MemoryBreakdown", "activation_memory", "alpha_beta_time", "bubble_fraction", "busbw_factor",
    "checkpoint_segments", "collective_bytes", "dp_step_comm_bytes", "hsdp_step_comm_bytes", "recompute_overhead",
    "sqrt_checkpoint_memory", "tp_layer_comm_bytes", "training_memory",
    "OFFLOADS", "OFFLOAD_MIN_STAGE", "offloaded_memory",
]
