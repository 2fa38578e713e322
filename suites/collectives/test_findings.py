"""Third-party behaviour this suite found, kept under watch.

torch.distributed.all_to_all_single(t, t) — output aliasing input — returns blocks in the wrong
places on gloo (torch 2.13, found by test_conformance's in-place all_to_all; minimal case: 2 ranks,
1 element per block). The ``torch`` adapter therefore reports in-place all_to_all as unsupported.
This test is a strict xfail: when torch fixes it, it passes, fails the suite, and the adapter's
Unsupported can go.
"""

from __future__ import annotations

import pytest

from .ranks import torch_all_to_all_aliased


@pytest.mark.xfail(strict=True, reason="torch all_to_all_single silently corrupts aliased output on gloo")
def test_torch_all_to_all_single_in_place(world_cache, world_sizes):
    n = max(world_sizes)
    if n < 2 or world_cache.get(n).backend != "gloo":
        pytest.skip("needs two gloo ranks")
    wrong = world_cache.get(2).run(torch_all_to_all_aliased, 1)
    assert sum(wrong) == 0, f"{sum(wrong)} wrong elements across ranks"
