"""Third-party behaviour this suite found, kept under watch (each test fails when the package changes it).

DeepSpeed 0.19.8: the default ``gradient_clipping`` is 1.0 (runtime/constants.py), so a config that does
not mention clipping silently rescales every step whose gradient norm exceeds 1 — training then differs
from the same optimizer without DeepSpeed (minimal case: Linear(4, 1, bias=False), input 3 * ones, one
SGD step: gradient norm 6.0, momentum buffer norm 1.0; found as a uniform 0.81x on a transformer block
whose gradient norm was 1.24). The ``deepspeed`` adapter sets gradient_clipping 0.
"""

from __future__ import annotations

import pytest

from . import findings_ranks as ranks


def test_deepspeed_clips_gradients_by_default(world_cache, world_sizes):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    if 1 not in world_sizes:
        pytest.skip("needs a 1-rank world")
    big = world_cache.get(1).run(ranks.deepspeed_default_clipping, 3.0, timeout=300)[0]
    assert big["applied_norm"] == pytest.approx(1.0, rel=1e-6), big  # clipped from 6.0
    small = world_cache.get(1).run(ranks.deepspeed_default_clipping, 0.25, timeout=300)[0]
    assert small["applied_norm"] == pytest.approx(0.5, rel=1e-6), small  # below 1: untouched
