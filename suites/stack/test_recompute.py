"""A stack checkpointing its blocks, selectively (``Layout.checkpoint_policy="selective"``: the matmuls' outputs saved,
every other op recomputed) or in full, equals one device — and recomputes what its policy says: its step's ops,
counted, against its step without checkpointing (``harness.stack.recompute``): selective runs the same matmuls and
more other ops; full runs more matmuls. A compiled stack (``Layout.compile``: each block through ``torch.compile``,
inductor on this CPU) equals the eager one device; compiled and selective, its recompute is counted in the backward
graphs torch.compile's partitioner makes. The Llama (its SwiGLU, RMSNorms and rotary are the ops selective
recomputes)."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.stack.judge import hold
from harness.stack.recompute import check
from reference.models import ModelSpec
from suites._support.stack import ADAM, LLAMA, LLAMA32, held, named_cases

SHORT32 = ModelSpec(**{**LLAMA32.as_dict(), "layers": 2})
"""The compiled cases' Llama: two blocks (inductor compiles the block once; each further block is a recompile)."""

SAC = {"checkpointing": True, "checkpoint_policy": "selective"}
CASES = [  # (id, spec, layout, recipe)
    ("selective", LLAMA, Layout(1, 1, 1, **SAC), Recipe()),
    ("selective-tp-clip", LLAMA, Layout(1, 1, 2, **SAC), Recipe(max_grad_norm=0.05)),
    ("selective-fsdp-accumulate", LLAMA, Layout(2, zero=3, **SAC), Recipe(accumulation=2)),
    ("selective-pp", LLAMA, Layout(1, 2, 1, **SAC), Recipe()),
    ("full-fsdp-tp", LLAMA, Layout(2, 1, 2, zero=2, checkpointing=True), Recipe()),
    ("compiled", SHORT32, Layout(1, 1, 1, compile=True), Recipe(optimizer=ADAM)),
    ("compiled-selective", SHORT32, Layout(1, 1, 1, compile=True, **SAC), Recipe(optimizer=ADAM)),
    ("compiled-fsdp", SHORT32, Layout(2, zero=2, compile=True), Recipe(optimizer=ADAM, accumulation=2)),
    ("compiled-fsdp-tp", SHORT32, Layout(2, 1, 2, zero=2, compile=True), Recipe(optimizer=ADAM, max_grad_norm=0.05)),
    ("compiled-selective-pp", SHORT32, Layout(1, 2, 1, compile=True, **SAC), Recipe(optimizer=ADAM)),
]
THOROUGH = {"selective-pp", "full-fsdp-tp", "compiled-selective", "compiled-fsdp", "compiled-fsdp-tp",
            "compiled-selective-pp"}
"""tox's budget: selective at one rank, tp and FSDP; one compiled case, torchtitan's (inductor's first compile in a
process: ~15 s on 2 cores with a cold cache, then ~5 s a stack; the torch stack's is thorough: its compiled step runs in
tox under the planted policies below); compiled and selective (its recompute counted in the partitioned
backward graphs — in tox by the planted test below, which compiles no inductor kernel), compiled under FSDP2 (with
accumulation), FSDP2 x TP and the pipeline, full checkpointing under FSDP2 x TP in the thorough env."""


@pytest.mark.parametrize("spec, layout, recipe", named_cases(CASES, THOROUGH))
def test_checkpointed_or_compiled_stack_equals_one_device(stack_impl, spec, layout, recipe, world_cache, conformance,
                                                          sweep):
    marked = [case[1:] for case in CASES if case[0] in THOROUGH]  # whole rows of the thorough env: never in tox
    sweep.require((spec, layout, recipe) not in marked and not (stack_impl == "torch" and layout.compile),
                  "thorough: the torch stack's compiled case (inductor's own compile of its blocks, ~13 s cold); tox "
                  "compiles torchtitan's, and the torch stack's compiled step runs in tox under the planted policies")
    v = held(world_cache, conformance, stack_impl, layout.world_size, spec, layout, recipe)
    assert v["outcome"] == "pass", v["problems"][:4]


def test_full_checkpointing_recomputes_the_blocks(stack_impl, world_cache):
    """One rank, the Llama, checkpointing "full": the step runs more matmuls than without (the blocks' forwards
    again) — a stack that says it checkpoints and does not is caught here, its gradients being the same."""
    off = check(world_cache.get(1), stack_impl, LLAMA32, Layout(1, 1, 1, checkpointing=True), Recipe(optimizer=ADAM))
    if isinstance(off, str):
        pytest.skip(f"{stack_impl}: {off}")
    assert off == [], off


@pytest.mark.parametrize("planted, says", [
    pytest.param("SelectiveIgnored", "recomputed nothing", marks=[pytest.mark.thorough]),
    ("SelectiveSavesNoMatmul", "were not all saved")])
def test_a_compiled_selective_policy_not_applied_is_seen_in_its_backward_graphs(planted, says, world_cache):
    """Compiled, the same two planted stacks: the ops of the backward graphs torch.compile's partitioner made
    (``harness.stack.compiled_ops``; inductor's kernels reach no dispatch mode) against the compiled step without
    checkpointing — measured (torch 2.13, the two-block Llama): selective 18 matmuls and 251 other ops, without
    checkpointing 18 and 158, recomputed whole (``SelectiveSavesNoMatmul``) 26 and 251, not checkpointed
    (``SelectiveIgnored``) 18 and 158. The torch stack's own compiled selective case: no problem (its tox case)."""
    off = check(world_cache.get(1), f"suites.stack.planted:{planted}", SHORT32,
                Layout(1, 1, 1, compile=True, **SAC), Recipe(optimizer=ADAM))
    if isinstance(off, str):
        pytest.skip(off)
    assert len(off) == 1 and says in off[0], off


@pytest.mark.parametrize("planted, says", [
    ("SelectiveIgnored", "recomputed nothing"), ("SelectiveSavesNoMatmul", "were not all saved")])
def test_a_selective_policy_not_applied_fails_by_its_count(planted, says, world_cache, conformance):
    """Planted: "selective" asked, no checkpointing run (``SelectiveIgnored``), or every block recomputed whole
    (``SelectiveSavesNoMatmul``) — both one device's gradients exactly, both failed by the ops counted."""
    v = hold(world_cache, conformance, f"suites.stack.planted:{planted}", 1, LLAMA, Layout(1, 1, 1, **SAC), Recipe())
    assert v["outcome"] == "fail" and any(says in p for p in v["problems"]), v["problems"][:4]


def _count_where_the_aot_api_records_nothing() -> dict:
    """Rank side: ``step_ops`` of a compiled selective case with the recorder's probe failed (as on a torch whose
    ``functorch.compile`` moved): its verdict."""
    from harness.stack import compiled_ops
    from harness.stack.recompute import step_ops

    saved = list(compiled_ops._WORKS)
    compiled_ops._WORKS[:] = [False]
    try:
        return step_ops("torch", SHORT32, Layout(1, 1, 1, compile=True, **SAC), Recipe(optimizer=ADAM))
    finally:
        compiled_ops._WORKS[:] = saved


def test_a_compiled_count_this_torch_cannot_record_is_unsupported_in_one_sentence(world_cache):
    """The fallback of the recorder's guard: where its probe fails, the compiled count is unsupported, saying why (the
    gradients are still held)."""
    [got] = world_cache.get(1).run(_count_where_the_aot_api_records_nothing, timeout=120)
    assert set(got) == {"unsupported"} and "functorch.compile" in got["unsupported"], got
