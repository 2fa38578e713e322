"""torchao on this machine: what runs, what gloo cannot run and why (a watch: when gloo moves float8, the six
float8 all-gather cases of torchao run here and this test says so)."""

from __future__ import annotations

import pytest

from harness.low_precision.case import Case
from suites._support.layers import judge_low_precision as judge

pytest.importorskip("torchao", reason="torchao is not installed (pip install 'paritybench[torchao]')")


def _probe(_):
    import torch.distributed as dist

    from harness.adapters.torchao.low_precision import float8_collective_error

    return float8_collective_error(dist.group.WORLD)


def test_watch_gloo_cannot_all_gather_float8(world_cache):
    """gloo (torch 2.13) has no float8 type: its all-gather raises 'Invalid scalar type'. When this fails, gloo moves
    float8 — the torchao cases unsupported for it now run: drop this watch."""
    world = world_cache.get(2)
    if world.backend != "gloo":
        pytest.skip(f"the watch is gloo's; this World runs {world.backend}")
    errors = world.run(_probe, None, timeout=60)
    assert all(e and "Invalid scalar type" in e for e in errors), errors


def test_torchao_float8_all_gather_is_unsupported_on_gloo_with_the_reason(world_cache, conformance):
    world = world_cache.get(2)
    if world.backend != "gloo":
        pytest.skip(f"the float8 all-gather runs on {world.backend}")
    outcome, refused, _, _ = judge(world_cache, conformance, "torchao",
                                   Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True))
    assert outcome == "unsupported" and "Invalid scalar type" in refused and "nccl" in refused, (outcome, refused)

