"""Third-party configurations the watch tests hold (not planted bugs: ways a user can set them up)."""

from __future__ import annotations

from harness.adapters.deepspeed.ulysses import DeepSpeedUlysses


class DeepSpeedUlyssesWithoutSequenceGroup(DeepSpeedUlysses):
    """``DistributedAttention`` given its group, with no sequence-parallel group registered in DeepSpeed."""

    register_group = False

    def shard(self, dense, group, layout):
        from deepspeed.utils import groups

        groups.mpu = None  # as in a fresh process that never registered one
        return super().shard(dense, group, layout)
