"""Watch tests of the stack suite's third-party findings (harness/records/findings.py)."""

from __future__ import annotations

import pytest

from harness.runtime.world import ImplementationFailure, verdict_of
from suites._support.worlds import gloo_only

from . import findings_ranks as ranks

CPU = "a finding of the CPU path: its ranks' modules, meshes and stages are on the CPU (on a GPU node untested)"


def test_a_new_pipeline_schedule_drops_fsdp2_accumulated_gradients(world_cache):
    """torch.distributed.pipelining over an FSDP2 module: a new schedule on the same PipelineStage re-runs
    its shape inference, whose clean-up sets every FSDP parameter's grad to None — the passes accumulated
    so far are lost, silently. The same schedule object accumulates. Fails once torch keeps them."""
    world = world_cache.get(1)
    gloo_only(world, CPU)
    assert world.run(ranks.fsdp_pipeline_grads_over_two_schedules, True, timeout=120)[0] == {
        "sum": True, "second_only": False}
    assert world.run(ranks.fsdp_pipeline_grads_over_two_schedules, False, timeout=120)[0] == {
        "sum": False, "second_only": True}


def test_inf_norm_of_an_empty_fsdp_shard_raises(world_cache):
    """torch.nn.utils.get_total_norm(..., inf) — torchtitan's clip_grad_norm_ — on FSDP2 gradients raises on a
    rank whose shard is empty ("_foreach_norm cannot compute the infinity norm on an empty tensor"), while
    its peers wait in the reduction; the 2-norm of the same shards works. Minimal case: Linear(3, 1) over 2
    ranks. Fails once torch takes the inf norm of an empty shard as 0."""
    world = world_cache.get(2)
    gloo_only(world, CPU)
    with pytest.raises(ImplementationFailure) as info:  # rank 0 left waiting in the reduction, then ended
        world.run(ranks.inf_norm_of_an_empty_fsdp_shard, timeout=60)
    first = verdict_of(info.value)
    assert first.startswith("rank 1: ") and "cannot compute the infinity norm on an empty tensor" in first, first


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=[pytest.mark.thorough])])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "sp"])
def test_watch_a_compiled_tp_block_after_a_tp_embedding_drops_its_gradient(backend, sequence_parallel, world_cache):
    """torch (2.12.1 - 2.15.0, CPU / gloo): a compiled block of Colwise / Rowwise projections fed by an embedding under
    ``RowwiseParallel`` (Replicate in; Replicate out, or with sequence parallelism Shard(1)) back-propagates no gradient
    into the embedding under FSDP2 — all zeros, silently — and without FSDP2 its backward raises in DTensor's
    ``Redistribute.backward`` ('Tensor' object has no attribute '_local_tensor'). Eager, the same model is one
    device's. In the torch stack: every compiled case with tp > 1. Fails once torch compiles the case right (or raises
    under FSDP2 too). The bug is before inductor's code generation: ``aot_eager`` (dynamo + AOTAutograd, no inductor)
    shows the same two outcomes (2026-12-04), so tox watches it there (~3 s; inductor's own compile ~11 s cold, the
    thorough env)."""
    world = world_cache.get(2)
    gloo_only(world, CPU)
    args = (backend, sequence_parallel)
    assert world.run(ranks.compiled_tp_block_after_a_tp_embedding, True, *args, timeout=300)[0] == "zero"
    without = world.run(ranks.compiled_tp_block_after_a_tp_embedding, False, *args, timeout=300)[0]
    assert without.startswith("raised AttributeError") and "_local_tensor" in without, without


REBUILT = "rebuilt parameter indices size is not same as original model parameters size"


def test_watch_ddp_under_pipelining_raises_after_two_backwards_in_a_row(world_cache):
    """torch 2.12.1 - 2.15.0 (CPU, gloo): one pipeline rank, its stages in DDP over 2 ranks, every schedule over the
    micro-batch counts of ``test_ddp.RAISED`` (the table the finding's condition is) — step 1's gradients are DDP's
    (every replica of stage 0 the same), and step 2's forward raises DDP's bucket-rebuild assert exactly where the
    table says (GPipe over 2 or more; interleaved, interleaved zero bubble, ZB-V and DualPipeV over 2, their 2
    stages); the rest train both steps (1F1B, ZB-H1 and GPipe over 1: the controls). Fails once torch trains these
    under DDP, or raises elsewhere."""
    from suites.stack.test_ddp import RAISED

    world = world_cache.get(2)
    gloo_only(world, CPU)
    for (schedule, pp, m), raised in RAISED.items():
        if pp == 1:  # every rank raises together (at pp 2 a stage's peers wait for it: the hang window each)
            per_rank = world.run(ranks.ddp_pipeline, schedule, m, timeout=120)
            first = [r["agree"] if isinstance(r["agree"], bool) else r["agree"][0] for r in per_rank]
            assert all(first) and [REBUILT in r["step 2"] for r in per_rank] == [raised] * 2, (schedule, m, per_rank)
            assert raised or [r["step 2"] for r in per_rank] == ["ok"] * 2, (schedule, m, per_rank)


def test_watch_ddp_under_zero_bubble_reduces_only_the_first_stage(world_cache):
    """torch 2.12.1 - 2.15.0 (CPU, gloo; pytorch #144530): DDP over 2 replicas, one step — ZB-H1 over dp 2 x pp 2: the
    first stage's replicas agree after the step (DDP reduced them), the last stage's do not (ranks 1 and 3: mesh (dp,
    pp)); interleaved zero bubble and ZB-V on one pipeline rank: stage 0 reduced, stage 1 not; DualPipeV on one
    pipeline rank (stages 0 and 1, the first and the last): both reduced; under 1F1B every replica agrees (the
    control). Fails once torch reduces every stage under zero bubble."""
    world = world_cache.get(4)
    gloo_only(world, CPU)
    zb = world.run(ranks.ddp_pipeline, "zb-h1", 2, 2, 1, timeout=120)
    assert [r["agree"] for r in zb] == [True, False, True, False], zb
    assert all(r["agree"] for r in world.run(ranks.ddp_pipeline, "1f1b", 2, 2, 1, timeout=120))
    two = world_cache.get(2)
    for schedule, want in (("interleaved-zb", [True, False]), ("zbv", [True, False]), ("dualpipev", [True, True])):
        assert [r["agree"] for r in two.run(ranks.ddp_pipeline, schedule, 4, 1, 1, timeout=120)] == [want] * 2, schedule
