"""A stack sharding hybrid (``Layout.replicate``: the dp x cp ranks as a replicate x shard mesh, ZeRO within each
shard group, each reduced shard all-reduced across the replicas — torch's FSDP2 on a 2-D mesh, HSDP) equals one
device: every split of the data-parallel ranks, the degenerate (n, 1) mesh (every shard group one rank: pytorch
#154888's silent non-reduction) included, and with tensor and pipeline parallelism beside it. (1, n) is
``replicate`` 1: every other stack case. The bound is the case's (``harness.stack.case.bound``): hybrid sharding
regroups the same sums."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.records import registry
from harness.runtime.capabilities import require_dtype
from harness.stack.judge import hold
from reference.models import ModelSpec
from suites._support.stack import ADAM, GPT, LLAMA, LLAMA32, held, named_cases

GPT16 = ModelSpec(**{**GPT.as_dict(), "dtype": "bfloat16"})
LLAMA16 = ModelSpec(**{**LLAMA.as_dict(), "dtype": "bfloat16"})

CASES = [  # (id, spec, layout, recipe)
    ("2x2-zero2", GPT, Layout(4, zero=2, replicate=2), Recipe()),
    ("4x1-zero2", GPT, Layout(4, zero=2, replicate=4), Recipe(max_grad_norm=0.05)),
    ("2x1-zero3", LLAMA, Layout(2, zero=3, replicate=2), Recipe(accumulation=2)),
    ("2x1-zero1-tp", LLAMA, Layout(2, 1, 2, zero=1, replicate=2), Recipe(max_grad_norm=0.05)),
    ("2x1-zero2-tp-adam", LLAMA32, Layout(2, 1, 2, zero=2, replicate=2), Recipe(optimizer=ADAM)),
    ("2x2-zero3-adam", LLAMA32, Layout(4, zero=3, replicate=2), Recipe(optimizer=ADAM, max_grad_norm=0.05)),
    ("2x1-zero1-pp", GPT, Layout(2, 2, 1, zero=1, replicate=2), Recipe(accumulation=2)),
    ("2x2-zero3", LLAMA, Layout(4, zero=3, replicate=2), Recipe(max_grad_norm=0.05)),
    ("2x2-zero2-tp", LLAMA, Layout(4, 1, 2, zero=2, replicate=2), Recipe(max_grad_norm=0.05)),
    ("4x2-zero2", GPT, Layout(8, zero=2, replicate=4), Recipe()),
    ("2x4-zero1", GPT, Layout(8, zero=1, replicate=2), Recipe(max_grad_norm=0.05)),
    ("2x2-zero1-pp-tp", LLAMA, Layout(4, 2, 1, zero=1, replicate=2), Recipe()),
    ("2x1-zero1-cp", LLAMA, Layout(1, 1, 1, zero=1, cp=2, replicate=2), Recipe()),
    ("2x2-zero2-bf16", GPT16, Layout(4, zero=2, replicate=2), Recipe(max_grad_norm=0.05)),
    ("2x1-zero1-tp-bf16", LLAMA16, Layout(2, 1, 2, zero=1, replicate=2), Recipe(accumulation=2)),
]
"""bf16 (fp32 masters sharded within each shard group, the low-precision gradients reduced in fp32 across both
groups): held precision-matched as every bf16 stack case (``harness.stack.mixed``)."""
THOROUGH = {"2x2-zero3", "2x2-zero2-tp", "4x2-zero2", "2x4-zero1", "2x2-zero1-pp-tp", "2x1-zero1-cp",
            "2x1-zero2-tp-adam", "2x1-zero1-pp", "2x1-zero1-tp-bf16", "2x2-zero2", "4x1-zero2"}
"""tox's budget: the 2- and 4-rank splits ((2, 2) — in float32 with Adam, what torchtitan trains, and in bf16 —, (2, 1):
the degenerate (n, 1) mesh of pytorch #154888), tp beside them; (4, 1) (torch's 8.6 s: the (n, 1) split again, at ZeRO 2
and clipped), the 8-rank meshes, pp, FSDP2 x tp at 8, cp, the float64 (2, 2) and a second torchtitan case in the
thorough env."""


@pytest.mark.parametrize("spec, layout, recipe", named_cases(CASES, THOROUGH))
def test_hybrid_sharded_stack_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance):
    require_dtype(world_cache.get(layout.world_size), spec.dtype, conformance, suite="stack", impl=stack_impl)
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe)
    assert v["outcome"] == "pass", v["problems"][:4]


@pytest.mark.parametrize("spec, layout", [
    pytest.param(GPT, Layout(4, zero=2, replicate=2), id="2x2"),
    pytest.param(GPT, Layout(2, zero=1, replicate=2), id="2x1"),
    pytest.param(GPT16, Layout(4, zero=2, replicate=2), id="2x2-bf16", marks=[pytest.mark.thorough])])
def test_hybrid_without_the_replicas_reduction_fails(spec, layout, world_cache, conformance):
    """Planted (``HybridNoReplicaReduction``): each replica keeps its own rows' gradient — at (2, 2) and at the
    degenerate (2, 1), where the shard groups reduce nothing at all; and in bf16 (the fp32 masters' path)."""
    require_dtype(world_cache.get(layout.world_size), spec.dtype)
    v = hold(world_cache, conformance, "suites.stack.planted:HybridNoReplicaReduction", layout.world_size, spec,
             layout, Recipe())
    assert v["outcome"] == "fail", v["problems"][:4]


@pytest.mark.parametrize("kwargs, sentence", [
    ({"dp": 4, "zero": 2, "replicate": 3}, "must be a whole number dividing dp x cp"),
    ({"dp": 2, "zero": 0, "replicate": 2}, "needs zero >= 1"),
    ({"dp": 2, "zero": 2, "replicate": 0}, "must be a whole number dividing"),
])
def test_a_hybrid_layout_that_cannot_be_is_one_sentence(kwargs, sentence):
    with pytest.raises(ValueError, match=sentence):
        Layout(**kwargs)


PARTIAL = [  # (option, spec, layout, recipe, in every profile)
    ("harness.adapters.torch.stack:ReshardToPairs", GPT, Layout(4, zero=3), Recipe(max_grad_norm=0.05), True),
    ("harness.adapters.torch.stack:ReshardToPairs", LLAMA32, Layout(4, 1, 1, zero=3),
     Recipe(optimizer=ADAM, accumulation=2), False),
    ("harness.adapters.torch.stack:ReshardToPairs", GPT, Layout(8, zero=3, replicate=2), Recipe(), False),
    ("harness.adapters.deepspeed.stack:Hpz", LLAMA32, Layout(4, zero=3), Recipe(optimizer=ADAM), False),
]
"""Partial resharding — ZeRO 3's parameters resharded after forward to a smaller group, the backward's all-gathers
within it (the state still sharded over the whole shard group): FSDP2's ``reshard_after_forward=2`` at 4 ranks and
under a (2, 4) hybrid mesh, DeepSpeed ZeRO++'s hpZ (``zero_hpz_partition_size`` 2; its accumulating and bf16 cases
are the DeepSpeed options' file's). A stale or wrongly placed secondary copy would feed the next backward other
weights: two steps, every tensor."""


@pytest.mark.parametrize("option, spec, layout, recipe", [
    pytest.param(*c[:4], id=f"{c[0].rsplit(':', 1)[1]}-{c[1].family}-{c[2].label()}-zero3",
                 marks=[] if c[4] else [pytest.mark.thorough]) for c in PARTIAL])
def test_partially_resharded_stack_equals_one_device(option, spec, layout, recipe, world_cache, conformance):
    if "deepspeed" in option and (why := registry.skip_reason(registry.resolve("deepspeed", "stack"))):
        pytest.skip(f"deepspeed: {why}")
    v = held(world_cache, conformance, option, layout.world_size, spec, layout, recipe)
    assert v["outcome"] == "pass", v["problems"][:4]


def test_partial_resharding_outside_zero3_is_one_sentence(world_cache, conformance):
    v = hold(world_cache, conformance, "harness.adapters.torch.stack:ReshardToPairs", 2, GPT, Layout(2, zero=2),
             Recipe())
    assert v["outcome"] == "unsupported" and "non-trivial divisor" in v["refused"] and "\n" not in v["refused"], v


def _fsdp2_partial_reshard_of_a_dtensor() -> str:
    """A Linear made a DTensor by a one-rank TP plan, then ``fully_shard(reshard_after_forward=2)`` over 4 ranks, one
    forward: "ran", or what FSDP2 raises."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from harness.runtime.rank import rank_device

    mesh = init_device_mesh(rank_device().type, (4, 1), mesh_dim_names=("dp", "tp"))
    lin = parallelize_module(torch.nn.Linear(4, 4, device=rank_device()), mesh["tp"], ColwiseParallel())
    fully_shard(lin, mesh=mesh["dp"], reshard_after_forward=2)
    try:
        lin(torch.ones(2, 4, device=rank_device())).sum().backward()
        return "ran"
    except NotImplementedError as exc:
        return str(exc)


def test_watch_fsdp2_reshards_no_dtensor_to_a_smaller_group(world_cache):
    """Watch: torch's FSDP2 refuses ``reshard_after_forward=<int>`` for parameters that are DTensors already (a TP
    plan's), at the first forward — so ``ReshardToPairs`` runs tp 1 with plain parameters and says so for tp > 1.
    Fails when torch lifts it (then hold the option with TP)."""
    got = world_cache.get(4).run(_fsdp2_partial_reshard_of_a_dtensor, timeout=120)
    assert got == ["Resharding to smaller mesh is not supported for DTensor parameters yet"] * 4, got
