"""harness.comm_count counts an all-to-all's variable splits however the caller passes them (megatron-core's
dispatcher passes a numpy array: counting it raised, and the benchmark row read "unsupported")."""

from __future__ import annotations

import pytest

from . import ranks


@pytest.mark.parametrize("how", ["list", "numpy", "positional"])
def test_variable_splits_count_the_rows_that_leave(how, world_cache):
    n = 3
    got = world_cache.get(n).run(ranks.all_to_all_counted, how)
    want = [sum((r + 1 + p) * 3 * 4 for p in range(n) if p != r) for r in range(n)]  # rows of 3 float32 to peers
    assert got == want, (got, want)
