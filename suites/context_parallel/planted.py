"""Planted bugs behind the context-parallel contract, loaded by spec like a user's implementation."""

from __future__ import annotations

from reference.context_parallel import ReferenceContextParallel


def _planted(algorithm: str, **bug):
    class Planted(ReferenceContextParallel):
        def __init__(self):
            super().__init__(algorithm, **bug)
    return Planted


LocalCausalMask = _planted("ring", local_mask=True)
"""Ring attention's causal mask by position within the shard, not in the sequence."""
LocalRotary = _planted("ring", local_rotary=True)
"""q and k rotated at their positions within the shard."""
MergeWithoutRunningMax = _planted("ring", no_running_max=True)
"""The blocks' softmax merged as exp(score) sums, without the running maximum."""
ZigzagSecondChunkShifted = _planted("ring", second_chunk_shifted=True)
"""The zigzag's second chunk taken as chunk r + cp (a remote block paired with the wrong positions)."""
UlyssesHeadsReversed = _planted("ulysses", reversed_heads=True)
"""Ulysses' inverse all-to-all puts the head groups back in the wrong order."""
UlyssesReplicasNotSummed = _planted("ulysses", replicas_not_summed=True)
"""A KV head replicated onto cp / kv_heads ranks keeps one replica's gradient, not their sum."""
