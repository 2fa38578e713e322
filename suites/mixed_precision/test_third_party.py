"""Third-party mixed precision against one device running the same recipe (harness.mixed_precision.
third_party): FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce) at stages 2-3, DDP over a bf16 model
(no master, as one device; with ZeroRedundancyOptimizer at stage 1), fp16 with torch.amp.GradScaler over
FSDP2 and over DDP + autocast, DeepSpeed bf16 at ZeRO 0-3 and fp16 (its own dynamic-scaler rule,
reproduced on one device: DeepSpeedRule) at DP 2 — every rank's fp32 masters (or bf16 parameters) within
harness/mixed_precision/case.py's bound. Measured (torch 2.13, deepspeed 0.19.8, CPU): FSDP2 5.7e-5,
DeepSpeed bf16 5.6e-5 (the reference's own figure), DDP bf16 4.9e-4 (bound 7.2e-3), torch fp16 2.9e-6
(bound 4.4e-4). DeepSpeed fp16 disagrees twice — both findings with watch tests (harness/records/findings.py)."""

from __future__ import annotations

import pytest

from harness.mixed_precision import third_party as tp
from harness.records import findings

CASES = [("fsdp2", 2), ("fsdp2", 3), ("ddp-bf16", 0), ("ddp-bf16", 1), ("deepspeed", 0), ("deepspeed", 2),
         ("deepspeed", 3)]


def _run(world_cache, stack, stage, steps=3, init_power=18, conformance=None):
    """Every rank's result; a case this machine cannot run (a dtype its CPU lacks, DeepSpeed refusing it
    here) is recorded unsupported with the device's own reason and skipped — never a failure or an xfail."""
    per_rank = world_cache.get(2).run(tp.train_stack, stack, stage, steps, 4, 0, init_power, timeout=300)
    reason = next((r["unsupported"] for r in per_rank if r.get("unsupported")), None)
    if reason:
        if conformance is not None:
            conformance.record("unsupported", suite="mixed_precision", world_size=2, collective=f"{stack}/stage{stage}",
                               impl="deepspeed" if stack.startswith("deepspeed") else "torch", detail=reason)
        pytest.skip(f"unsupported on this machine: {reason}")
    return per_rank


@pytest.mark.parametrize("stack, stage", CASES, ids=lambda v: str(v))
def test_bf16_stack_equals_one_device_running_its_recipe(stack, stage, world_cache, conformance):
    if stack.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    per_rank = _run(world_cache, stack, stage, conformance=conformance)
    problems = [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="mixed_precision", world_size=2, dtype="bfloat16",
                       collective=f"{stack}/stage{stage}", impl="torch" if stack != "deepspeed" else "deepspeed",
                       max_rel_err=max(r["worst"] for r in per_rank), detail=" | ".join(problems[:1]))
    assert not problems, problems[:3]


@pytest.mark.parametrize("stack, stage, init_power", [("fsdp2-fp16", 2, 18), ("fsdp2-fp16", 3, 18),
                                                       ("ddp-amp-fp16", 0, 22)], ids=lambda v: str(v))
def test_torch_fp16_with_grad_scaler_equals_one_device(stack, stage, init_power, world_cache, conformance):
    """torch.amp.GradScaler over FSDP2 (fp16 params, fp32 reduce) and over DDP + autocast: 6 steps, the first
    4 overflowing on both ranks and on one device (skipped, the scale halved each time), then 2 taken — scale
    and skips equal to one device's. The start avoids the band where a DP replica overflows and one device
    does not: a replica back-propagates its own mean loss, whose per-sample gradients are n x one device's
    (measured: DDP + autocast skipped at 2^19 where one device on the whole batch took steps at 2^21)."""
    per_rank = _run(world_cache, stack, stage, 6, init_power, conformance)
    problems = [p for r in per_rank for p in r["problems"]]
    conformance.record("fail" if problems else "pass", suite="mixed_precision", world_size=2, dtype="float16",
                       collective=f"{stack}/stage{stage}", impl="torch", max_rel_err=max(r["worst"] for r in per_rank),
                       detail=" | ".join(problems[:1]))
    assert not problems, problems[:3]
    assert all(r["scaler"]["skipped"] == 4 for r in per_rank), per_rank[0]["scaler"]


@pytest.mark.parametrize("stage, steps", [(1, 2), (1, 3), (0, 3)])
def test_deepspeed_fp16_against_one_device(stage, steps, world_cache, conformance):
    """fp16 from scale 2^14 with loss_scale_window 2: the scale grows at the 3rd step."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    per_rank = _run(world_cache, "deepspeed-fp16", stage, steps, 14, conformance)
    problems = [p for r in per_rank for p in r["problems"]]
    grew = steps >= 3
    known = (findings.match("deepspeed", "zero", problems, precision="fp16", stage=stage, scale_grew=grew)
             if problems else None)
    conformance.record("known-nonconformance" if known else "fail" if problems else "pass", finding=known,
                       suite="mixed_precision", world_size=2, dtype="float16", collective=f"deepspeed/stage{stage}",
                       impl="deepspeed", max_rel_err=max(r["worst"] for r in per_rank), detail=" | ".join(problems[:1]))
    if known:
        pytest.xfail(known.reason)
    assert not problems, problems[:3]


def test_deepspeed_fp16_halves_the_update_when_the_scale_grows(world_cache):
    """Watch test: fails once DeepSpeed unscales a step's gradients by the scale they were computed with."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    assert not _run(world_cache, "deepspeed-fp16", 1, 2, 14)[0]["problems"]  # before the growth: equal
    grown = _run(world_cache, "deepspeed-fp16", 1, 3, 14)
    assert all(r["problems"] and r["scaler"] == {"scale": 32768.0, "skipped": 0} for r in grown), grown[0]


def test_deepspeed_fp16_stage0_never_scales_the_loss(world_cache):
    """Watch test: at ZeRO 0 the masters barely move (updates / 2^18) and the scale only grows."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    per_rank = _run(world_cache, "deepspeed-fp16", 0, 6, 18)
    assert all(r["scaler"] == {"scale": 2.0**20, "skipped": 0} and r["problems"] for r in per_rank), per_rank[0]


def test_deepspeed_fp16_on_a_machine_without_fp16_is_unsupported_not_a_finding(world_cache):
    """On a CPU without fp16 GEMM kernels DeepSpeed's engine refuses fp16 ('Type fp16 is not supported on
    your device.'); here its capability check is made to answer no on any machine: every DeepSpeed fp16
    configuration — including those two findings' own (stage 0; stage 1 where the scale grows) — is
    unsupported with DeepSpeed's reason, and a finding explains no such failure."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    from harness.runtime.capabilities import deny_on_rank

    for stage, steps in ((0, 3), (1, 3)):
        per_rank = world_cache.get(2).run(deny_on_rank, "deepspeed-float16", tp.train_stack, "deepspeed-fp16",
                                          stage, steps, 4, 0, 14, timeout=300)
        assert all("Type fp16 is not supported on your device" in (r.get("unsupported") or "") for r in per_rank), \
            per_rank[0]
        assert all(not r["problems"] for r in per_rank), per_rank[0]
    refusal = ["raised ValueError: Type fp16 is not supported on your device."]
    for stage, grew in ((0, True), (1, True)):
        assert findings.match("deepspeed", "zero", refusal, precision="fp16", stage=stage, scale_grew=grew) is None


def test_a_cpu_without_a_dtype_is_unsupported(world_cache):
    """The torch stacks' dtype check made to answer no: unsupported with the reason, no problems."""
    from harness.runtime.capabilities import deny_on_rank

    per_rank = world_cache.get(2).run(deny_on_rank, "float16", tp.train_stack, "ddp-amp-fp16", 0, 2, timeout=300)
    assert all("cannot compute in float16" in (r.get("unsupported") or "") and not r["problems"] for r in per_rank)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_deepspeed_capability_check_agrees_with_its_engine(dtype, world_cache):
    """Watch test of the capability check: it says unsupported exactly where DeepSpeed's engine refuses the
    dtype (on this project's AMD EPYC machines: fp16, "Type fp16 is not supported on your device.")."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (extra paritybench[deepspeed])")
    ours, engine = world_cache.get(1).run(tp.deepspeed_capability_and_engine, dtype, timeout=300)[0]
    assert (ours is None) == (engine is None), (ours, engine)
    if engine is not None:
        assert engine.split(": ", 1)[1] in ours, (ours, engine)
