"""Third-party behaviour this suite found, kept under watch.

torch.distributed.all_to_all_single(t, t) — output aliasing input — returns blocks in the wrong
places on gloo (torch 2.13), silently and intermittently (a race: measured 16 of 20 calls wrong at
1 element per block on 2 ranks, 19 of 20 at 7, 0 of 20 at 1000). Found by test_conformance's in-place
all_to_all. The ``torch`` adapter therefore reports in-place all_to_all as unsupported. This test
fails once 20 calls in a row come back right: then the adapter's Unsupported can go.
"""

from __future__ import annotations

import pytest

from .ranks import torch_all_to_all_aliased


def test_torch_all_to_all_single_in_place_still_corrupts(world_cache, world_sizes):
    n = max(world_sizes)
    if n < 2 or world_cache.get(n).backend != "gloo":
        pytest.skip("needs two gloo ranks")
    world = world_cache.get(2)
    wrong_calls = sum(1 for _ in range(20) if sum(world.run(torch_all_to_all_aliased, 7)) > 0)
    assert wrong_calls > 0, "20 aliased all_to_all_single calls were all right: the bug looks fixed"
