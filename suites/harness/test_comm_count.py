"""harness.runtime.comm_count counts an all-to-all's variable splits however the caller passes them (megatron-core's
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


def test_functional_collectives_are_counted_and_run_as_torch_runs_them_where_their_private_api_is_missing(
        world_cache):
    """DTensor's all-reduce is counted through torch's private dispatch API; on a torch without
    ``_resolve_process_group`` the same redistribution runs and computes the same values, uncounted, and says
    why (the guard's fallback, driven on any torch)."""
    from reference.cost_model import collective_bytes

    world = world_cache.get(2)
    counted = world.run(ranks.functional_all_reduce_counted, False)
    assert [r["bytes"] for r in counted] == [collective_bytes("all_reduce", 2, 16)] * 2, counted
    fallback = world.run(ranks.functional_all_reduce_counted, True)
    for got in fallback:
        assert got["values"] == [3.0] * 4 and got["bytes"] == 0.0, got
        assert any("all_reduce's group could not be resolved" in why for why in got["uncounted"]), got
    assert [r["values"] for r in counted] == [[3.0] * 4] * 2


def test_the_mappings_own_name_for_a_collective_is_counted_once(world_cache):
    """The mappings hold ``dist.all_gather_single`` under their own name: patched by that name and again as an alias of
    torch's, it was counted twice (a sequence-parallel layer sent 2x the cost model's bytes)."""
    from reference.cost_model import collective_bytes

    whole = 32 * 64 * 4  # the gathered buffer, float32
    want = collective_bytes("all_gather", 2, whole) + collective_bytes("reduce_scatter", 2, whole)
    assert world_cache.get(2).run(ranks.sequence_gather_counted, None) == [[want, want]] * 2

