"""harness.runtime.gloo_float8: FSDP2's float8 all-gather on a CPU, as bytes."""

from __future__ import annotations

from suites._support.worlds import gloo_only

from . import ranks


def test_float8_all_gathers_move_as_bytes_on_gloo_and_every_other_call_is_torchs(world_cache):
    """``harness.runtime.gloo_float8`` wraps torch's all-gather: a float8 all-gather on gloo moves the uint8 views
    (every byte arrives where nccl puts it); a float32 one is torch's call unchanged. Watch: torch's own function
    still cannot move float8 on gloo — when it can, the shim goes."""
    world = world_cache.get(2)
    gloo_only(world, "the shim is for gloo")
    for got in world.run(ranks.float8_all_gathered_as_bytes, None):
        assert got["bytes"] and got["wrapped_once"], got
        assert got["floats"] == [0.0, 0.0, 1.0, 1.0], got
        assert got["own"] and "Invalid scalar type" in got["own"], got
