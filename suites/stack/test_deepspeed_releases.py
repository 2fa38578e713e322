"""Watches of DeepSpeed's findings that hold on its older releases only (harness/records/findings.py: each with its
range, measured by the release matrix, ``tox -e stacks-matrix``). Each runs where the installed release is inside its
finding's range — the matrix's venvs — and skips elsewhere, saying so: on the release tox pins they are fixed.
Each fails when DeepSpeed changes what it watches (then the finding's range is updated)."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.records import findings, registry
from harness.stack.judge import hold
from reference.models import ModelSpec

DEEPSPEED = registry.skip_reason(registry.resolve("deepspeed", "stack"))
pytestmark = pytest.mark.skipif(bool(DEEPSPEED), reason=f"deepspeed: {DEEPSPEED}")

HERE = "suites/stack/test_deepspeed_releases.py::"
GPT32 = ModelSpec("gpt", vocab=13, hidden=16, heads=8, ffn=24, layers=5, dtype="float32", tie_embeddings=True)
LLAMA32 = ModelSpec("llama", vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5, dtype="float32")


def _watched(name: str, world_cache, conformance, impl, spec, layout, recipe) -> dict:
    """The finding ``name`` watches, where the installed release is in its range: the verdict of its minimal case,
    which must be that finding (a pass, or another failure, means DeepSpeed changed)."""
    why = findings.outside_range(HERE + name)
    if why:
        pytest.skip(why)
    v = hold(world_cache, conformance, impl, layout.world_size, spec, layout, recipe)
    watched = next(f for f in findings.FINDINGS if f.watch == HERE + name)
    assert v["known"] is watched, (v["outcome"], v["problems"][:3])
    return v


def test_watch_checkpointing_on_a_cpu_calls_a_missing_stream(world_cache, conformance):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: DeepSpeed's accelerator has streams there")
    _watched("test_watch_checkpointing_on_a_cpu_calls_a_missing_stream", world_cache, conformance, "deepspeed",
             LLAMA32, Layout(1, 1, 1, checkpointing=True), Recipe())


def test_watch_pipeline_zero1_clips_by_a_smaller_norm(world_cache, conformance):
    v = _watched("test_watch_pipeline_zero1_clips_by_a_smaller_norm", world_cache, conformance, "deepspeed", GPT32,
                 Layout(1, 2, 1, zero=1), Recipe(max_grad_norm=0.05))
    assert any("gradient norm" in p and "None" not in p for p in v["problems"]), v["problems"][:3]


def test_watch_zero2_modifies_a_split_view_in_place(world_cache, conformance):
    _watched("test_watch_zero2_modifies_a_split_view_in_place", world_cache, conformance, "deepspeed", LLAMA32,
             Layout(2, 1, 1, zero=2), Recipe())


def test_watch_bf16_optimizer_with_fp32_accumulation_is_off(world_cache, conformance):
    from harness.runtime.capabilities import require_dtype

    require_dtype(world_cache.get(2), "bfloat16")
    _watched("test_watch_bf16_optimizer_with_fp32_accumulation_is_off", world_cache, conformance,
             "harness.adapters.deepspeed.stack:Fp32GradAccum", ModelSpec(**{**LLAMA32.as_dict(), "dtype": "bfloat16"}),
             Layout(2, 1, 1, zero=1), Recipe(max_grad_norm=0.05, accumulation=2))
