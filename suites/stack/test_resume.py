"""A stack saved on one layout and resumed on another continues as the uninterrupted one device would:
one step on layout A, ``save``; a new trainer on layout B, ``load``, one more step — every rank's dense state
within the suite's bound of one device after two steps (SGD's momentum carried across). The pairs change
dp, tp, pp and the ZeRO stage, on both families (Llama's KV heads split on one side, replicated on the
other). A stack without save / load is unsupported here."""

from __future__ import annotations

import pytest

from harness.contracts.stack import Layout, Recipe
from harness.runtime.capabilities import require_dtype
from harness.runtime.world import run_or_fail
from harness.stack import case as ranks
from harness.verdict import reduce
from reference.zero import LRSchedule, OptimizerSpec
from suites._support.stack import GPT, LLAMA
from suites.stack.test_lr_schedule import COSINE
from suites.stack.test_tied import TIED32

CLIPPED, ADAM = Recipe(max_grad_norm=0.05), Recipe(optimizer=OptimizerSpec("adam", 1e-2))
WARMUP = Recipe(optimizer=OptimizerSpec("adam", 1e-2), lr_schedule=LRSchedule(warmup=2, start=1 / 3))
"""Adam under a warmup (1/3 then 2/3 of lr): the resumed trainer's step is the schedule's position 1 — a scheduler
restarted by the load trains it at position 0's, half the update."""
MUON64 = Recipe(optimizer=OptimizerSpec("muon", 0.02, weight_decay=0.1, adamw_lr=1e-2, eps=1e-3, ns_dtype="float64"),
                lr_schedule=COSINE)
"""Muon under a cosine (0.5, 1, 0.55 of lr): both of its optimizers' position carried (torch: two schedulers)."""
PAIRS = [(GPT, Layout(2, 1, 2, zero=2), Layout(1, 2, 2, zero=0, schedule="gpipe"), CLIPPED),
         (LLAMA, Layout(1, 1, 4, zero=0), Layout(2, 2, 1, zero=1, checkpointing=True), CLIPPED),
         (LLAMA, Layout(4, 1, 1, zero=2), Layout(1, 4, 1, zero=1), ADAM),
         (LLAMA, Layout(1, 1, 1, cp=4, zero=2), Layout(2, 1, 2, zero=1), CLIPPED),
         (LLAMA, Layout(2, 1, 2, zero=2), Layout(1, 2, 2, zero=0), MUON64),
         (LLAMA, Layout(2, 1, 2, zero=2), Layout(1, 2, 2, zero=0), WARMUP),
         (TIED32, Layout(2, 1, 2, zero=2), Layout(4, 1, 1, zero=2), ADAM),
         (LLAMA, Layout(2, 2, 1, zero=1), Layout(4, 1, 1, zero=1), ADAM),
         (LLAMA, Layout(2, 2, 1, zero=2, schedule="zbv"), Layout(1, 2, 2, zero=0, schedule="interleaved"), ADAM)]
"""dp 2 -> 1 with pp 1 -> 2 and ZeRO 2 -> 0; tp 4 over 2 KV heads (replicated) -> dp 2 x pp 2 (checkpointed);
dp 4 (ZeRO 2) -> pp 4 with middle stages, Adam (both moments and its step count carried). The first and the
last are what FSDP2 stacks run (ZeRO 2 over dp, KV heads split), so the torch stack's DCP resume is held on
them; the second is reference-only; the fourth changes cp (4 -> 1, dp 1 -> 2, tp 1 -> 2); the fifth carries Muon's
momentum (its matrices') and AdamW's moments (the rest) from ZeRO 2's flat shards over dp 2 x tp 2 to ZeRO 0 over
pp 2 x tp 2 — Newton-Schulz in float64 on both sides (its bfloat16 slack is the Muon suite's; here the bound is
the resume's), under a schedule; the sixth carries a learning-rate schedule's position (a stack that cannot:
unsupported, said); the seventh a tied embedding (float32, as torchtitan trains it: one parameter saved once, loaded
into both uses) from FSDP2 x TP to FSDP2 over 4; the eighth ZeRO 1's optimizer state, each tensor held by one replica
(torch: ZeroRedundancyOptimizer over DDP), from 2 replicas x pp 2 to 4 replicas — every tensor's owner changes; the
ninth four stages in a V (ZB-V: rank 0 holds the first and the last) sharded over 2 replicas, resumed as interleaved
1F1B (rank 0: the first and the third) over tp 2."""


def _id(v):
    if isinstance(v, Layout):
        return v.label() + (f"-{v.schedule}" if v.pp > 1 and v.schedule != "1f1b" else "")
    if isinstance(v, Recipe):
        return v.optimizer.name + ("-scheduled" if v.lr_schedule else "")
    return v.family + ("-tied" if v.tie_embeddings else "")


THIRD_PARTY_EVERY = (2, 3, 5, 7)
"""The pairs a third-party stack runs in every profile (a dp -> pp change with Adam, a cp change, the schedule's
position, ZeRO 1's owners); its others in the thorough env (the tox budget: torch's GPT pair costs 7 s)."""
REFERENCE_THOROUGH = (4, 6, 8)
"""Ours runs every pair everywhere but Muon's (the tox budget; its flat-shard state is read and written by the same
code as Adam's, whose pair runs in tox), the tied one (its tie is held on every layout by the main property) and the
two-stages-per-rank one (its stages are held under every schedule by the pipeline suites)."""


@pytest.mark.parametrize("spec, a, b, recipe", PAIRS, ids=_id)
def test_resume_on_another_layout_equals_one_device(stack_impl, spec, a, b, recipe, world_cache, sweep,
                                                    conformance, tmp_path):
    i = PAIRS.index((spec, a, b, recipe))
    sweep.require((stack_impl == "reference" and i not in REFERENCE_THOROUGH) or i in THIRD_PARTY_EVERY,
                  "a pair of the thorough env (THIRD_PARTY_EVERY, REFERENCE_THOROUGH)")
    per_rank = run_or_fail(world_cache.get(4), ranks.resume_stack, stack_impl, spec, a, b, recipe, str(tmp_path),
                           timeout=300, failed=ranks.failed)
    outcome, refused, problems = reduce(per_rank)
    conformance.record(outcome, suite="stack", world_size=4, dtype=spec.dtype, impl=stack_impl,
                       collective=f"resume {spec.family} {a.label()}/zero{a.zero} -> {b.label()}/zero{b.zero}",
                       detail=refused or " | ".join(problems[:1]))
    if outcome == "unsupported":
        pytest.skip(refused)
    assert outcome == "pass", problems[:4] or refused


def test_resume_without_the_optimizer_state_fails(world_cache, tmp_path):
    spec, a, b, _ = PAIRS[0]
    per_rank = run_or_fail(world_cache.get(4), ranks.resume_stack, "suites.stack.planted:ResumeForgetsMomentum", spec,
                           a, b, Recipe(), str(tmp_path), timeout=300, failed=ranks.failed)
    problems = [p for r in per_rank for p in r["problems"]]
    assert any("momentum_buffer" in p for p in problems) and any("parameter" in p for p in problems), problems[:3]


def test_the_torch_stacks_fp16_resumes_its_loss_scale(world_cache, tmp_path):
    """fp16's dynamic loss scale travels with the checkpoint. Over dp 2 from 2^16, growing every clean step, the
    steps alternate: step 1 applied (-> 2^17), 2 overflows and is skipped (-> 2^16), 3 applied (-> 2^17: saved),
    4 skipped, 5 applied. The loaded trainer then trains as the uninterrupted one — bitwise (the same weights,
    state, scale and batch); one restarted at 2^16 would take step 4 instead of skipping it."""
    from .mixed_ranks import torch_fp16_resumed

    require_dtype(world_cache.get(2), "float16")
    for got in world_cache.get(2).run(torch_fp16_resumed, str(tmp_path), timeout=300):
        (l1, l2, l3), (l4, l5) = got["losses"], got["after"][0]
        assert l1 != l2 == l3 != l4 == l5, got  # a skipped step leaves the next one the same weights: the same loss
        assert got["saved"] == got["loaded"] and got["saved"]["scale"] == 2.0**17, got
        assert got["after"][0] == got["after"][1] and got["scales_after"][0] == got["scales_after"][1], got
        assert got["off"] == 0.0, got
