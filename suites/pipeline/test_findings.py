"""Third-party behaviour this suite found, kept under watch.

torch.distributed.pipelining (torch 2.13, gloo) raises on unequal microbatches — a batch of 7 in 2
microbatches: "The size of tensor a (4) must match the size of tensor b (3)" — while the contract
splits with tensor_split like torch.tensor_split does. The ``torch`` pipeline adapter reports such
cases as unsupported. When torch handles them this test fails: then drop the adapter's Unsupported.
"""

from __future__ import annotations

import pytest

from harness.runtime.world import RankFailure

from .ranks import torch_uneven_microbatches


def test_torch_pipelining_still_raises_on_unequal_microbatches(world_cache, world_sizes):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    with pytest.raises(RankFailure) as info:
        world_cache.get(2).run(torch_uneven_microbatches, 7, 2, timeout=60)
    assert "must match the size of tensor b (3)" in str(info.value)
