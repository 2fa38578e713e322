"""Padded batches: the stack contract's loss is the mean cross-entropy over the global batch's counted targets
(targets equal to -100 do not count), whatever the replica, micro-batch, accumulation pass or context-parallel
shard they fall in. The batches the cases draw (``harness.stack.inputs.global_batch(..., padded=True)``), and the
two normalisation bugs a full batch cannot show, planted and caught."""

from __future__ import annotations

import pytest
import torch

from harness.contracts.stack import Layout, Recipe
from harness.stack.inputs import IGNORE, global_batch, valid_counts
from harness.stack.judge import hold
from suites._support.stack import GPT, LLAMA


@pytest.mark.parametrize("rows, seq", [(2, 4), (4, 4), (8, 4), (16, 8), (12, 4)])
def test_a_padded_batch_counts_differently_in_every_contiguous_block(rows, seq):
    """Row 0 full, the last row empty, counts falling with the row: each split into equal contiguous blocks (a
    stack's replicas, passes, micro-batches) gives blocks of different counts, the last the fewest."""
    counts = valid_counts(rows, seq)
    assert counts[0] == seq and counts[-1] == 0 and counts == sorted(counts, reverse=True)
    for blocks in (b for b in (2, 4) if rows % b == 0 and rows // b >= 1):
        per = rows // blocks
        sums = [sum(counts[i * per:(i + 1) * per]) for i in range(blocks)]
        assert len(set(sums)) == blocks, (blocks, sums)
    tokens, targets = global_batch(13, rows, 0, seq, padded=True)
    assert (targets != IGNORE).sum(dim=1).tolist() == counts
    assert torch.equal(tokens, global_batch(13, rows, 0, seq)[0])  # the same tokens as the full batch
    kept = global_batch(13, rows, 0, seq)[1]
    assert torch.equal(targets[targets != IGNORE], kept[targets != IGNORE])  # right padding: a prefix kept


@pytest.mark.parametrize("planted, n, spec, layout, recipe", [
    ("MeanPerMicroBatch", 2, GPT, Layout(1, 2, 1), Recipe()),  # 4 micro-batches of one row, the last empty
    ("MeanPerMicroBatch", 1, LLAMA, Layout(), Recipe(accumulation=2)),  # accumulation alone
    ("MeanPerRank", 2, LLAMA, Layout(2, 1, 1), Recipe()),  # DDP's average of per-rank means
    ("MeanPerRank", 4, GPT, Layout(2, 1, 2, zero=1), Recipe(max_grad_norm=0.05)),  # clipped: the norm shows it
], ids=["micro-batch-mean-pp2", "micro-batch-mean-accumulating", "rank-mean-dp2", "rank-mean-dp2-tp2-clipped"])
def test_a_loss_normalised_per_micro_batch_or_per_rank_passes_full_batches_and_fails_padded_ones(
        planted, n, spec, layout, recipe, world_cache, conformance):
    impl = f"suites.stack.planted:{planted}"
    full = hold(world_cache, conformance, impl, n, spec, layout, recipe)
    assert full["outcome"] == "pass", full["problems"][:3]  # equal counts everywhere: the bug cannot show
    v = hold(world_cache, conformance, impl, n, spec, layout, recipe, padded=True, localise=False)
    assert v["outcome"] == "fail" and any("loss after step 1" in p for p in v["problems"]), v["problems"][:3]
    assert any("parameter" in p or "optimizer state" in p for p in v["problems"]), v["problems"][:3]
    if recipe.max_grad_norm is not None:
        assert any("gradient norm" in p for p in v["problems"]), v["problems"][:3]


def test_the_stack_case_fixture_holds_a_stack_on_its_users_own_case(stack_case):
    """What docs/contracts/stack.md ("Your own case") shows: the fixture, public names only — the user's sizes,
    layout and recipe, a padded batch; a layout the stack does not provide is unsupported with its sentence."""
    from reference.models import ModelSpec

    mine = ModelSpec("llama", vocab=50, hidden=32, heads=4, kv_heads=2, ffn=48, layers=2)
    v = stack_case("docs.examples.ddp_stack:DDPStack", mine, Layout(dp=2), Recipe(max_grad_norm=1.0, accumulation=2),
                   padded=True)
    assert v["outcome"] == "pass", v["problems"][:3]
    v = stack_case("docs.examples.ddp_stack:DDPStack", mine, Layout(pp=2), Recipe())
    assert v["outcome"] == "unsupported" and "data parallel only" in v["refused"], v


def _rank0_only() -> list:
    import torch
    import torch.distributed as dist

    from harness.stack.helpers import from_rank0

    mine = {"params": {"w": torch.arange(3.0)}, "grad_norm": 1.5} if dist.get_rank() == 0 else None
    got = from_rank0(mine)
    return [got["params"]["w"].tolist(), got["grad_norm"]]


def test_a_state_built_on_rank_0_only_reaches_every_rank(world_cache):
    """``harness.stack.helpers.from_rank0``: what a library builds on rank 0 alone, as ``dense_state`` on all."""
    assert world_cache.get(3).run(_rank0_only) == [[[0.0, 1.0, 2.0], 1.5]] * 3
