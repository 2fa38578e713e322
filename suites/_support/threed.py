"""What the 3D test files share: the (schedule, ZeRO stage, checkpointing) combinations each layout rotates."""

from __future__ import annotations

import itertools

COMBOS = list(itertools.product(("gpipe", "1f1b", "interleaved"), (0, 1, 2), (False, True)))
