"""Watch tests of the stack suite's third-party findings (harness/findings.py)."""

from __future__ import annotations

from . import findings_ranks as ranks


def test_a_new_pipeline_schedule_drops_fsdp2_accumulated_gradients(world_cache):
    """torch.distributed.pipelining over an FSDP2 module: a new schedule on the same PipelineStage re-runs
    its shape inference, whose clean-up sets every FSDP parameter's grad to None — the passes accumulated
    so far are lost, silently. The same schedule object accumulates. Fails once torch keeps them."""
    world = world_cache.get(1)
    assert world.run(ranks.fsdp_pipeline_grads_over_two_schedules, True, timeout=120)[0] == {
        "sum": True, "second_only": False}
    assert world.run(ranks.fsdp_pipeline_grads_over_two_schedules, False, timeout=120)[0] == {
        "sum": False, "second_only": True}
