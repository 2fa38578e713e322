"""Planted bug: checkpointing that does not restore the RNG state, so recomputed dropout draws new masks."""

from reference.checkpoint import ReferenceCheckpointing


class NoRngRestore(ReferenceCheckpointing):
    def __init__(self):
        super().__init__(restore_rng=False)
