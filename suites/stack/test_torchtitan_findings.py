"""Watches of torchtitan 0.2.x's findings (harness/stack/findings.py: each with its range): they run where the installed
release is inside it (the release matrix's venvs) and skip elsewhere, saying so."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.records import registry
from suites._support.stack import ADAM, LLAMA32

TORCHTITAN = registry.skip_reason(registry.resolve("torchtitan", "stack"))
pytestmark = pytest.mark.skipif(bool(TORCHTITAN), reason=f"torchtitan: {TORCHTITAN}")


def _norm_ratio(layout) -> tuple[float, int]:
    """(torchtitan's reported pre-clip norm / one device's, the global batch's counted targets) of one clipped
    step on ``layout``."""
    from harness.records import registry as reg
    from harness.stack.case import one_device
    from harness.stack.inputs import global_batch, valid_tokens

    recipe = Recipe(optimizer=ADAM, max_grad_norm=0.05)
    tokens, targets = global_batch(LLAMA32.vocab, layout.dp * layout.num_microbatches, 0, padded=True)
    trainer = reg.load("torchtitan", "stack").build(LLAMA32, layout, recipe)
    trainer.load_dense(LLAMA32.build(0).state_dict())
    trainer.step(tokens, targets)
    want = one_device(LLAMA32, recipe, 0, tokens, targets, 1)[0]["norm"]
    return trainer.dense_state()["grad_norm"] / want, valid_tokens(targets)


def _watched_range(name: str) -> None:
    from harness.records import findings

    why = findings.outside_range(f"suites/stack/test_torchtitan_findings.py::{name}")
    if why:
        pytest.skip(why)


def test_watch_torchtitan_02_ddp_divides_by_dp_twice(world_cache):
    """The finding's minimal case (0.2.x): dp 2 under DDP — the norm it reports is one device's / 2 (float32 sums:
    1e-4). Fails once 0.2's DDP sums."""
    _watched_range("test_watch_torchtitan_02_ddp_divides_by_dp_twice")
    for ratio, _ in world_cache.get(2).run(_norm_ratio, Layout(2, 1, 1, zero=0), timeout=300):
        assert abs(ratio - 0.5) <= 1e-4, ratio


def test_watch_torchtitan_02_pipeline_back_propagates_the_summed_loss(world_cache):
    """The finding's minimal case (0.2.x): pp 2 — the norm it reports is one device's times the global count of
    counted targets (float32 sums: 1e-4). Fails once its pipeline divides by the count."""
    _watched_range("test_watch_torchtitan_02_pipeline_back_propagates_the_summed_loss")
    for ratio, count in world_cache.get(2).run(_norm_ratio, Layout(1, 2, 1), timeout=300):
        assert abs(ratio - count) <= 1e-4 * count, (ratio, count)
