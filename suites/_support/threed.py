"""What the 3D test files share: the (schedule, ZeRO stage, checkpointing) combinations each layout rotates."""

from __future__ import annotations

import itertools

from reference.pipeline import FUSED_BACKWARD

COMBOS = list(itertools.product(FUSED_BACKWARD, (0, 1, 2), (False, True)))
