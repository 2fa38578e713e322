"""A stack equals one device under the pipeline schedules of 2026: ZB-H1 and interleaved zero bubble (the backward
split into I and W), ZB-V and DualPipeV (two stages per rank placed as a V: the embedding and the LM head on pipeline
rank 0). Each case at pp = 2 with what makes a schedule's bugs show: accumulation (W's of two passes summed),
clipping (the norm of gradients that W produced), a tied embedding where the V puts both copies on one rank, FSDP
sharding, tensor parallelism inside the stages. Float64 with SGD (ours, torch), float32 with Adam (torchtitan,
ours, torch). A stack that does not run a schedule says so (unsupported, its sentence)."""

from __future__ import annotations

import math

import pytest

from harness.contracts.stack import Layout, Recipe
from reference.models import ModelSpec
from suites._support.stack import ADAM, GPT, LLAMA, LLAMA32, held

TIED = ModelSpec(**{**GPT.as_dict(), "tie_embeddings": True})
CASES = [
    ("zb-h1", LLAMA, Layout(1, 2, 2, schedule="zb-h1"), Recipe(max_grad_norm=0.05, accumulation=2)),
    ("interleaved-zb", GPT, Layout(1, 2, 1, schedule="interleaved-zb", checkpointing=True),
     Recipe(max_grad_norm=0.02, norm_type=math.inf)),
    ("zbv-tied", TIED, Layout(1, 2, 1, schedule="zbv"), Recipe(max_grad_norm=0.05)),
    ("zbv-fsdp", LLAMA, Layout(2, 2, 1, zero=2, schedule="zbv"), Recipe(accumulation=2)),
    ("dualpipev", LLAMA, Layout(1, 2, 2, schedule="dualpipev"), Recipe(max_grad_norm=0.05)),
    ("dualpipev-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="dualpipev"), Recipe(optimizer=ADAM, accumulation=2)),
    ("zbv-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="zbv"), Recipe(optimizer=ADAM, max_grad_norm=0.05)),
    ("interleaved-zb-fp32-adam", LLAMA32, Layout(1, 2, 1, schedule="interleaved-zb"), Recipe(optimizer=ADAM)),
]


@pytest.mark.parametrize("spec, layout, recipe", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_stack_under_the_schedule_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance):
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe, padded=True)
    assert not v["problems"], v["problems"][:4]


def _torch_stages(layout) -> dict:
    """Rank side: the torch stack built on ``layout`` (the float32 Llama, Adam), two steps; the pipeline stages this
    rank holds, the one-device blocks of each, torch's schedule class it ran and how many forwards each stage's module
    ran in the second step."""
    from harness.adapters.torch.stack import TorchStack
    from harness.stack.inputs import global_batch, rows_for, seq_for

    recipe = Recipe(optimizer=ADAM)
    built = TorchStack().build(LLAMA32, layout, recipe)
    built.load_dense(LLAMA32.build(0).state_dict())
    t, forwards = built.trainer, [0] * len(built.trainer.submods)
    for i, module in enumerate(t.submods):
        module.register_forward_hook(lambda *_, i=i: forwards.__setitem__(i, forwards[i] + 1))
    batch = global_batch(LLAMA32.vocab, rows_for(layout, recipe), 0, seq_for(layout))
    built.step(*batch)  # the first step's shape inference runs one more forward per stage: the second's counted
    forwards[:] = [0] * len(forwards)
    built.step(*batch)
    prefix = [f"{i}." if len(t.submods) > 1 else "" for i in range(len(t.submods))]
    blocks = [sorted({int(dense.split(".")[1]) for n, dense in t.names.items()
                      if n.startswith(pre) and dense.startswith("blocks.")}) for pre in prefix]
    return {"stages": t.indices, "blocks": blocks, "schedule": type(t._schedule).__name__, "forwards": forwards}


@pytest.mark.parametrize("schedule", ["interleaved", "interleaved-zb", "zbv", "dualpipev"])
def test_the_torch_stack_holds_two_stages_per_rank_under_the_schedule(schedule, world_cache):
    """The torch stack under a schedule of two stages per rank: each pipeline rank holds the stages
    ``reference.pipeline.placement`` gives it (0 and 2 on rank 0 interleaved; 0 and 3 in the V) with their contiguous
    blocks (5 over 4 stages: 0-1, 2, 3, 4), runs torch's multi-stage class and runs every micro-batch's forward
    through each — the numbers alone cannot tell a stack that ran one stage per rank under 1F1B."""
    from harness.adapters.torch.stack_trainer import SCHEDULES
    from reference.pipeline.generators import placement

    layout = Layout(1, 2, 1, schedule=schedule)
    m, blocks = layout.num_microbatches, {0: [0, 1], 1: [2], 2: [3], 3: [4]}
    for rank, got in enumerate(world_cache.get(2).run(_torch_stages, layout, timeout=120)):
        stages = [s for s, r in enumerate(placement(schedule, 2, 2)) if r == rank]
        assert got == {"stages": stages, "blocks": [blocks[s] for s in stages], "schedule": SCHEDULES[schedule],
                       "forwards": [m, m]}, (rank, got)
