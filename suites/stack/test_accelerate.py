"""Hugging Face accelerate held to one device through the stack contract (harness/adapters/accelerate/stack.py):
``Accelerator.prepare``, ``accumulate`` / ``backward``, ``clip_grad_norm_``, DDP at ZeRO 0 and its FSDP2 plugin at
ZeRO 2 / 3 (on an accelerator: on a CPU accelerate ignores the plugin — its finding, refused here), padded
batches, float32; and its process-global state, reset between the cases a long-lived rank runs."""

from __future__ import annotations

import math

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.records import registry
from harness.stack.judge import hold
from reference.models import ModelSpec
from reference.zero import OptimizerSpec
from suites._support.stack import padded_at

ACCELERATE = registry.skip_reason(registry.resolve("accelerate", "stack"))
pytestmark = pytest.mark.skipif(bool(ACCELERATE), reason=f"accelerate: {ACCELERATE}")

GPT32 = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5, dtype="float32", tie_embeddings=True)
LLAMA32 = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5, dtype="float32")

CASES = [  # (spec, layout, recipe, in every profile)
    (LLAMA32, Layout(1, 1, 1), Recipe(max_grad_norm=0.05, accumulation=2), True),
    (GPT32, Layout(2, 1, 1), Recipe(max_grad_norm=0.05, norm_type=math.inf), True),  # tied, one replica each
    (LLAMA32, Layout(2, 1, 1), Recipe(accumulation=2), True),  # unclipped SGD accumulating over dp
    (LLAMA32, Layout(2, 1, 1, zero=3), Recipe(max_grad_norm=0.05, accumulation=2), True),  # FSDP2 (a GPU node)
    (LLAMA32, Layout(4, 1, 1), Recipe(optimizer=OptimizerSpec("adam", 1e-2, eps=1e-3)), False),
    (GPT32, Layout(2, 1, 1, zero=2, checkpointing=True), Recipe(accumulation=2), True),  # FSDP2 + its AC
    (LLAMA32, Layout(3, 1, 1), Recipe(max_grad_norm=0.05), False),
]


@pytest.mark.parametrize("spec, layout, recipe, padded", [
    pytest.param(s, lay, r, padded_at(i), id=f"{s.family}-{lay.label()}-zero{lay.zero}" + "-padded" * padded_at(i),
                 marks=[] if every else [pytest.mark.thorough]) for i, (s, lay, r, every) in enumerate(CASES)])
def test_accelerate_equals_one_device(spec, layout, recipe, padded, world_cache, conformance):
    v = hold(world_cache, conformance, "accelerate", layout.world_size, spec, layout, recipe, padded=padded)
    if v["outcome"] == "unsupported" and layout.zero >= 2:  # the machine's: accelerate's FSDP wants an accelerator
        pytest.skip(v["refused"])
    assert v["outcome"] == "pass", v["problems"][:4] or v["refused"]


@pytest.mark.parametrize("layout, needle", [(Layout(2, 1, 1, zero=1), "ZeRO 1"), (Layout(1, 1, 2), "tp_plan"),
                                            (Layout(1, 2, 1), "no pipeline")], ids=["zero1", "tp2", "pp2"])
def test_what_the_accelerate_stack_does_not_do_is_said_in_one_sentence(layout, needle, world_cache, conformance):
    v = hold(world_cache, conformance, "accelerate", layout.world_size, LLAMA32, layout, Recipe())
    assert v["outcome"] == "unsupported" and needle in v["refused"] and "\n" not in v["refused"], v


def _fsdp_then_ddp() -> tuple:
    """Rank side: an accelerate trainer asking for FSDP2, then one for DDP, in one process (a long-lived rank):
    what the second sees."""
    import contextlib
    import os

    from harness.adapters.accelerate.stack import AccelerateStack
    from harness.contracts import Unsupported

    with contextlib.suppress(Unsupported):  # a CPU: refused after accelerate saw the plugin (and wrote its variable)
        AccelerateStack().build(LLAMA32, Layout(2, 1, 1, zero=3), Recipe())
    second = AccelerateStack().build(LLAMA32, Layout(2, 1, 1), Recipe(accumulation=2))
    return (os.environ.get("ACCELERATE_USE_FSDP"), second.accelerator.distributed_type.value,
            second.accelerator.gradient_accumulation_steps)


def test_a_rank_reused_across_cases_starts_each_from_accelerates_defaults(world_cache):
    """accelerate's singletons and the environment variable its FSDP plugin writes do not leak into the next
    case on the same rank: the DDP case after an FSDP one has no ACCELERATE_USE_FSDP and its own accumulation."""
    import torch

    ddp = "MULTI_GPU" if torch.cuda.is_available() else "MULTI_CPU"
    assert world_cache.get(2).run(_fsdp_then_ddp, timeout=120) == [(None, ddp, 2)] * 2


def _without_reset() -> tuple:
    """Rank side: accelerate without its private ``_reset_state`` — the guard falls back to accelerate's own
    behaviour (its state kept), says so once, and the trainer still builds."""
    from unittest import mock

    from accelerate.state import AcceleratorState

    from harness.adapters.accelerate import stack as a

    a.RESET_FALLBACKS.clear()
    with mock.patch.object(AcceleratorState, "_reset_state", None):
        trainer = a.AccelerateStack().build(LLAMA32, Layout(2, 1, 1), Recipe())
    return len(a.RESET_FALLBACKS), trainer.accelerator.distributed_type.value


def test_without_accelerates_private_reset_the_stack_falls_back_to_its_own_behaviour(world_cache):
    assert world_cache.get(2).run(_without_reset, timeout=120) == [(1, "MULTI_CPU")] * 2


def _fsdp_plugin_on_a_cpu() -> tuple:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    from harness.adapters.accelerate.stack import reset_accelerate

    reset_accelerate()
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = acc.prepare(torch.nn.Linear(2, 2))
    kind = acc.distributed_type.value
    reset_accelerate()
    return kind, type(model).__name__


def test_watch_accelerate_ignores_its_fsdp_plugin_on_a_cpu(world_cache):
    """The finding (harness/records/findings.py): on a CPU the FSDP plugin leaves the type MULTI_CPU and the model in
    DDP. Fails when accelerate shards there (then the adapter's refusal goes) or says no."""
    from harness.records.findings import outside_range

    why = outside_range("suites/stack/test_accelerate.py::test_watch_accelerate_ignores_its_fsdp_plugin_on_a_cpu")
    if why:
        pytest.skip(why)
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: accelerate's FSDP applies there")
    assert world_cache.get(2).run(_fsdp_plugin_on_a_cpu, timeout=120) == [("MULTI_CPU", "DistributedDataParallel")] * 2


def _prepared_scheduler_steps() -> list:
    """Rank side: a prepared ``LambdaLR`` under accelerate's defaults (split_batches off) at 2 processes — its
    ``last_epoch`` after each of 3 updates (``optimizer.step`` then ``scheduler.step``, as accelerate's examples)."""
    import torch
    from accelerate import Accelerator

    from harness.adapters.accelerate.stack import reset_accelerate

    reset_accelerate()
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, scheduler = acc.prepare(model, optimizer,
                                              torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0))
    out = []
    for _ in range(3):
        acc.backward(model(torch.ones(1, 2)).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        out.append(scheduler.scheduler.last_epoch)
    reset_accelerate()
    return out


def test_watch_accelerate_steps_a_prepared_scheduler_once_per_process(world_cache):
    """The finding (harness/stack/findings.py): accelerate's ``AcceleratedScheduler`` steps the scheduler it wraps
    num_processes times per optimizer update (split_batches off: each process's batch is taken as one of the
    schedule's steps) — a schedule written in updates runs num_processes times as fast: at 2 processes its position
    after 3 updates is 6. The accelerate adapter writes the contract's schedule in those steps. Fails once accelerate
    steps it once per update by default."""
    from harness.records.findings import outside_range

    why = outside_range("suites/stack/test_accelerate.py::test_watch_accelerate_steps_a_prepared_scheduler_once_per_"
                        "process")
    if why:
        pytest.skip(why)
    assert world_cache.get(2).run(_prepared_scheduler_steps, timeout=120) == [[2, 4, 6]] * 2
