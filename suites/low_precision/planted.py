"""Planted bugs behind the low-precision contract, loaded by spec like a user's implementation."""

from __future__ import annotations

from reference.low_precision import ReferenceLowPrecision


def _planted(**bug):
    class Planted(ReferenceLowPrecision):
        def __init__(self):
            super().__init__(**bug)
    return Planted


AmaxOverLocalShard = _planted(local_amax=True)
"""Every amax taken over this rank's shard, never reduced (torchtitan #3109's kind: rowwise under TP)."""
AmaxOverDataParallel = _planted(amax_over_dp=True)
"""The amaxes TP must reduce reduced over the data-parallel group instead (Megatron-LM PR 442's kind)."""
GathersInHighPrecision = _planted(gather_high_precision=True)
"""The float8 all-gather asked, the weight all-gathered in float32 (torchtitan #3123's kind): the values agree,
the bytes do not."""
StaleWeightScale = _planted(stale_weight_scale=True)
"""The weight's scale kept from the first step (delayed scaling where the recipe says this step's)."""
