"""Third parties under the context-parallel contract, and what cannot run here.

- DeepSpeed-Ulysses (``deepspeed-ulysses``: its ``DistributedAttention``) runs the equivalence property
  with every implementation (test_equivalence.py); here the cases of DeepSpeed #8291 — heads cp does not
  divide, grouped-query heads split unevenly — must equal one device or be refused in one sentence, never
  a wrong result or a crash.
- torch's ``context_parallel`` cannot run on a CPU: watch tests of what it raises per SDPA backend (they
  fail once torch runs it, and the GPU guide lists it for ``tox -e gpu``)."""

from __future__ import annotations

import pytest

from harness.context_parallel.case import Case
from harness.context_parallel.third_party import torch_context_parallel_probe
from harness.records import findings, registry
from harness.records.releases import TORCHTITAN_03
from suites._support.layers import judge_context_parallel as judge
from suites._support.worlds import gloo_only

DEEPSPEED = registry.skip_reason(registry.resolve("deepspeed-ulysses", "context_parallel"))

ISSUE_8291 = [(4, Case(hidden=24, heads=12, kv_heads=12, seq=16)),   # 12 heads over sp 4: [3, 3, 3, 3]
              (4, Case(hidden=12, heads=6, kv_heads=6, seq=16)),     # 6 over 4: split unevenly, or refused
              (2, Case(hidden=12, heads=6, kv_heads=3, seq=8))]      # Q 6 / KV 3 over sp 2: the groups kept


@pytest.mark.skipif(bool(DEEPSPEED), reason=f"deepspeed-ulysses: {DEEPSPEED}")
@pytest.mark.parametrize("cp, case", ISSUE_8291, ids=["h12-sp4", "h6-sp4", "q6kv3-sp2"])
def test_deepspeed_ulysses_uneven_and_grouped_heads(cp, case, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, "deepspeed-ulysses", cp, case)
    known = findings.match("deepspeed-ulysses", "context_parallel", problems, kv_remainder=case.kv_heads % cp) \
        if outcome == "fail" else None
    if known:  # an older release's (its range: harness/records/findings.py)
        conformance.known.append(known)
        conformance.settle()
    assert outcome in ("pass", "refused", "unsupported"), problems[:3]
    if outcome != "pass":
        assert "\n" not in refused, refused


@pytest.mark.skipif(bool(DEEPSPEED), reason=f"deepspeed-ulysses: {DEEPSPEED}")
def test_watch_deepspeed_ulysses_uneven_kv_heads_before_the_fix(world_cache, conformance):
    """Watch, where the installed DeepSpeed is in the finding's range (0.18.0 to 0.19.4 measured): Q 6 / KV 3 over
    sp 2 fails with the shards' size mismatch. Fails once that release range stops doing it."""
    why = findings.outside_range("suites/context_parallel/test_third_party.py::"
                                 "test_watch_deepspeed_ulysses_uneven_kv_heads_before_the_fix")
    if why:
        pytest.skip(why)
    outcome, _, problems, _ = judge(world_cache, conformance, "deepspeed-ulysses", *ISSUE_8291[2])
    assert outcome == "fail" and findings.match("deepspeed-ulysses", "context_parallel", problems, kv_remainder=1), \
        problems[:3]


@pytest.mark.parametrize("backend, raised, needle", [
    ("FLASH_ATTENTION", "NotImplementedError", "does not have a sharding strategy registered"),
    ("MATH", "RuntimeError", "got mixed torch.Tensor and DTensor"),
    ("EFFICIENT_ATTENTION", "RuntimeError", "No viable backend"),
])
def test_torch_context_parallel_does_not_run_on_cpu(backend, raised, needle, world_cache, conformance):
    """Watch: torch 2.13's context_parallel on CPU — the CPU flash kernel has no DTensor sharding strategy,
    the math backend mixes DTensor and Tensor (pytorch #147793), the efficient kernel is CUDA-only."""
    gloo_only(world_cache.get(2), "a watch of the CPU path; on a GPU node torch's context_parallel is the GPU guide's")
    got = world_cache.get(2).run(torch_context_parallel_probe, backend, timeout=120)
    conformance.record("unsupported", suite="context_parallel", world_size=2, dtype="float64", impl="torch",
                       collective=f"context_parallel/{backend}", detail=": ".join(got[0]))
    assert all(r[0] == raised and needle in r[1] for r in got), got


@pytest.mark.skipif(bool(DEEPSPEED), reason=f"deepspeed-ulysses: {DEEPSPEED}")
def test_deepspeed_uneven_heads_read_the_registered_group_not_the_given_one(world_cache, conformance):
    """Watch (a way to set it up wrong that the suite shows): ``DistributedAttention(attn, group)`` with no
    sequence-parallel group registered in DeepSpeed (no mpu, no mesh). Its even-heads path uses ``group``;
    its uneven-heads path takes this rank's place from ``groups._get_sequence_parallel_rank()`` — 0 on every
    rank — so at Q 6 / KV 3 over 2 ranks rank 1 sizes its all-to-all as rank 0 and gloo's own size check
    fails on it while rank 0 waits (on NCCL nothing checks the sizes). Registered (the adapter's default,
    as Megatron-DeepSpeed's mpu does), the same case equals one device."""
    case = Case(hidden=12, heads=6, kv_heads=3, seq=8)
    outcome, _, problems, _ = judge(world_cache, conformance,
                                       "suites.context_parallel.variants:DeepSpeedUlyssesWithoutSequenceGroup", 2, case)
    assert outcome == "fail" and any("rank 1" in p and "inLengthPerRank" in p for p in problems), problems[:2]
    outcome, _, problems, _ = judge(world_cache, conformance, "deepspeed-ulysses", 2, case)
    if outcome == "fail" and findings.match("deepspeed-ulysses", "context_parallel", problems, kv_remainder=1):
        pytest.skip("this DeepSpeed release splits KV 3 over sp 2 wrongly even registered: its finding")
    assert outcome == "pass", problems[:3]


@pytest.mark.parametrize("name", ["ring-flash-attn", "yunchang"])
def test_flash_attention_stacks_are_registered_and_say_why_they_do_not_run(name):
    """ring-flash-attn and yunchang run flash-attn's fp16 / bf16 CUDA kernels: registered (a run names them),
    skipped where the packages are missing, and unsupported in one sentence at the property's float64."""
    from harness.adapters.flash_attn.context_parallel import FlashContextParallel
    from harness.contracts import Unsupported
    from reference.models import GQAttention

    impl = registry.resolve(name, "context_parallel")
    reason = registry.skip_reason(impl)
    assert reason is None or "not installed" in reason or "fails to import" in reason
    with pytest.raises(Unsupported) as err:
        FlashContextParallel(name).shard(GQAttention(8, 2, 1), None, "zigzag")
    assert "float64" in str(err.value) and "\n" not in str(err.value)


TORCHTITAN = registry.skip_reason(registry.ImplSpec("torchtitan", "stack", "x:y", requires=("torchtitan", "spmd_types"),
                                                    drives=TORCHTITAN_03))


@pytest.mark.skipif(bool(TORCHTITAN), reason=f"torchtitan: {TORCHTITAN}")
def test_torchtitans_context_parallelism_does_not_run_on_cpu(world_cache, conformance):
    """Watch: torchtitan's context parallelism (``apply_cp_to_forward`` on its SDPA core) wraps q, k, v as
    sequence-sharded DTensors for torch's context-parallel dispatcher — on CPU the same wall as torch's own:
    the CPU flash kernel has no sharding strategy. Fails once it runs (then the torchtitan stack takes cp)."""
    from suites.stack.torchtitan_ranks import torchtitan_cp_probe

    gloo_only(world_cache.get(2), "a watch of the CPU path")
    got = world_cache.get(2).run(torchtitan_cp_probe, timeout=120)
    conformance.record("unsupported", suite="context_parallel", world_size=2, dtype="float32", impl="torchtitan",
                       collective="apply_cp_to_forward/sdpa", detail=": ".join(got[0]))
    assert all(r[0] == "NotImplementedError" and "does not have a sharding strategy registered" in r[1]
               for r in got), got
