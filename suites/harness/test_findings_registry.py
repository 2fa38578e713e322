"""The findings registry is the suite's: only built-in implementations in the recorded version range,
under the recorded condition, match; no implementation attribute can excuse a failure or loosen a bound;
a known finding shows as xfail, and as a failure under ``pytest --strict``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.contracts.stack import Layout
from harness.pytest.plugin import Conformance
from harness.records import findings
from harness.records.findings import FINDINGS, Finding

ROOT = Path(__file__).resolve().parents[2]
ROUNDED = "output: 1 of 12 differ, first got 7.000000000000001 expected 7.0"
ROWWISE = next(f for f in FINDINGS if f.watch.endswith("::test_dtensor_rowwise_bias_rounds_on_three_ranks"))

# Per matchable finding (by its watch test): a case its condition holds, and a failure line of its own symptom —
# as the suite's case writes it. Every other failure in that configuration must stay a failure.
EXAMPLES = {
    "test_dtensor_rowwise_bias_rounds_on_three_ranks": ({"row_bias": True, "n": 3, "kind": "row"}, ROUNDED),
    "test_megatron_loss_includes_padded_vocabulary": (
        {"kind": "lm_head", "vocab_remainder": 1, "n": 2}, "loss: 1 of 1 differ, first got 2.25 expected 2.0"),
    "test_reentrant_checkpoint_drops_parameter_gradients_when_the_input_needs_none": (
        {"input_requires_grad": False}, "step 1: parameter 0 gradient missing"),
    "test_universal_conversion_of_an_sgd_checkpoint_fails": (
        {"optimizer": "sgd", "universal": True}, "ds_to_universal raised KeyError: 'exp_avg'"),
    "test_deepspeed_fp16_stage0_never_scales_the_loss": (
        {"precision": "fp16", "stage": 0}, "rank 0: parameter 1 off by 0.0102 > 0.000137"),
    "test_inf_norm_of_an_empty_fsdp_shard_raises": (
        {"norm_type": float("inf")}, "rank 7: RuntimeError: _foreach_norm cannot compute the infinity norm on an empty "
        "tensor because the operation does not have an identity (ranks [0, 1] of 8 were still inside ...)"),
    "test_deepspeed_fp16_halves_the_update_when_the_scale_grows": (
        {"precision": "fp16", "stage": 1, "scale_grew": True}, "rank 1: parameter 0 off by 0.0016 > 0.00014"),
    "test_watch_a_tied_embedding_under_fsdp_and_tp_is_off_at_step_two": (
        {"tie_embeddings": True, "tp": 2, "dp": 2, "norm_type": 2.0},
        "rank 0: step 2: parameter blocks.0.mlp.gate.weight: off by 0.00833 of its magnitude > 0.00557"),
    "test_watch_deepspeed_reports_no_norm_at_zero_stage_0": (
        {"zero": 0, "clipped": True, "pp": 1},
        "rank 0: step 1: gradient norm None vs one device 2.2511 (off by inf > 0.0098)"),
    "test_deepspeed_resume_across_layouts": (
        {"zero_change": (0, 1)}, "rank 0: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/tmp/x/deepspeed/step-1/zero_pp_rank_0_mp_rank_00_optim_states.pt'"),
    "test_watch_deepspeed_pipeline_clips_by_the_first_stages_norm": (
        {"zero": 0, "clipped": True, "pp": 2},
        "rank 0: step 1: gradient norm None vs one device 1.7846 (off by inf > 0.0105)"),
    "test_watch_deepspeed_zero0_clips_moe_by_the_mean_of_rank_norms": (
        {"zero": 0, "clipped": True, "ep": 2, "family": "moe"},
        "rank 0: step 1: optimizer state head.weight/momentum_buffer: off by 0.00623 of its magnitude > 0.00126"),
    "test_watch_deepspeed_zero3_divides_the_sequence_parallel_gradient_by_sp": (
        {"zero": 3, "cp": 2},
        "rank 0: step 1: parameter blocks.0.attn.o.weight: off by 0.0117 of its magnitude > 0.00278"),
    "test_watch_ddp_under_pipelining_raises_after_two_backwards_in_a_row": (
        {"zero": 0, "dp": 2, "layout": Layout(2, 1, 1, schedule="gpipe", microbatches=4)},
        "rank 0: RuntimeError: [Stage 0] failed to run forward: from RuntimeError: params_.size() == "
        "rebuilt_param_indices_.size() INTERNAL ASSERT FAILED at \"reducer.cpp\":2003, please report a bug to "
        "PyTorch. rebuilt parameter indices size is not same as original model parameters size.Original model param "
        "size is: 28 versus rebuilt params size of: 56 (after 1 step(s))"),
    "test_watch_ddp_under_zero_bubble_reduces_only_the_first_stage": (
        {"zero": 1, "dp": 2, "layout": Layout(2, 2, 1, zero=1, schedule="zb-h1")},
        "rank 0: step 1: gradient norm 1.1933221102470555 vs one device 0.8281664441767093 (off by 0.441 > 2.1e-11)"),
    "test_watch_a_compiled_tp_block_after_a_tp_embedding_drops_its_gradient": (
        {"compile": True, "tp": 2},
        "rank 0: step 1: optimizer state embed.weight/momentum_buffer: off by 0.219 of its magnitude > 0.0024"),
    "test_watch_deepspeed_bf16_zero0_counts_a_zero_gradient_adam_step": (
        {"optimizer": "adam", "zero": 0, "dtype": "bfloat16", "pp": 1, "checkpointing": False},
        "rank 0: step 1: master blocks.0.attn.k.weight: not Adam's step 1 of the stack's own state — element 24 "
        "0.0154908411, the step gives 0.0180498259 (3.28e+05 x fp32's rounding of it)"),
    "test_watch_deepspeed_muon_takes_an_lm_head_not_named_lm_head": (
        {"optimizer": "muon"}, "rank 0: step 1: optimizer state head.weight/exp_avg: missing from the dense state"),
    "test_watch_deepspeed_zero_muon_clips_the_orthogonalised_update": (
        {"optimizer": "muon", "clipped": True, "zero": 2},
        "rank 0: step 1: gradient norm 16.666484832763672 vs one device 1.2880154848098755 (off by 11.9 > 0.00998)"),
    "test_watch_torchtitan_02_ddp_divides_by_dp_twice": (
        {"zero": 0, "dp": 2},
        "rank 0: step 1: gradient norm 0.2526765465736389 vs one device 0.5053530931472778 (off by 0.5 > 0.0641)"),
    "test_watch_torchtitan_02_pipeline_back_propagates_the_summed_loss": (
        {"pp": 2},
        "rank 0: step 1: gradient norm 20.186540603637695 vs one device 2.883791446685791 (off by 6 > 0.0117)"),
    "test_torch_split_backward_double_counts_a_weight_used_twice": (
        {"schedule": "zbv", "shared": "stage"}, "step-1 gradient of parameter 20: max diff 76.0"),
    "test_megatron_with_a_vocabulary_tp_does_not_divide_is_the_known_finding": (
        {"vocab_remainder": 1}, "rank 0: loss after step 1: 2.926025390625 vs one device 2.860689163208008"),
    "test_megatron_tied_to_a_padded_vocabulary_is_the_known_finding": (
        {"vocab_remainder": 1, "tie_embeddings": True},
        "rank 0: step 1: parameter blocks.0.attn.v.weight: off by 0.009 of its magnitude > 0.0024"),
    "test_watch_megatron_cannot_load_a_checkpoint_of_sgd": (
        {"optimizer": "sgd", "zero": 0}, "rank 0: TypeError: 'NoneType' object is not callable"),
    "test_watch_megatrons_distributed_optimizer_cannot_load_its_checkpoint": (
        {"optimizer": "adam", "zero": 1}, "rank 0: KeyError: 'step'"),
    "test_watch_checkpointing_on_a_cpu_calls_a_missing_stream": (
        {"checkpointing": True}, "rank 0: TypeError: 'NoneType' object is not callable (after 0 step(s))"),
    "test_watch_pipeline_zero1_clips_by_a_smaller_norm": (
        {"zero": 1, "clipped": True, "pp": 2},
        "rank 0: step 1: gradient norm 7.642232418060303 vs one device 11.551180839538574 (off by 0.338 > 0.0102)"),
    "test_watch_zero2_modifies_a_split_view_in_place": (
        {"zero": 2, "pp": 1}, "rank 0: RuntimeError: Output 0 of Split is a view and is being modified inplace. "
                              "(after 0 step(s))"),
    "test_watch_float8_all_gather_of_rows_dp_does_not_divide_hangs": (
        {"fp8_all_gather": True, "rows_remainder": 1},
        "rank 0 never entered all_reduce #7 on ranks [0, 1] that rank 1 waits in; rank 0 is in foreach_all_gather "
        "(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:240)"),
    "test_watch_torchtitans_emulated_rowwise_float8_is_tensorwise": (
        {"recipe": "float8-rowwise"}, "rank 0: step 0, call 0: output: 2.1e+04 u32 of its magnitude at (3, 17) "
                                      "(bound 36): 0.0625 vs one device's 0.0703125"),
    "test_watch_bf16_optimizer_with_fp32_accumulation_is_off": (
        {"option": "harness.adapters.deepspeed.stack:Fp32GradAccum", "zero": 1},
        "rank 0: step 1: gradient norm 2.02530837059021 vs one device 1.3754749298095703 (off by 0.65 > 6.66 x "
        "|g - g_exact| = 0.0142)"),
    "test_watch_deepspeed_ulysses_uneven_kv_heads_before_the_fix": (
        {"kv_remainder": 1}, "rank 0: forward raised RuntimeError: The size of tensor a (3) must match the size of "
                             "tensor b (2) at non-singleton dimension 2"),
    "test_watch_transformers_ep_halves_expert_gradients": (
        {"ep": 2, "n": 2}, "rank 0: gradient model.layers.0.mlp.experts.down_proj: off by 0.5 of its magnitude > "
                           "0.00137"),
    "test_watch_torchtitan_moe_under_ep_and_tp_without_sp_cannot_run": (
        {"family": "moe", "ep": 2, "tp": 2, "sequence_parallel": False},
        "rank 3: RuntimeError: Can not redistribute from S(1) to P(sum), redistributing to Partial is for internal "
        "use only! (after 0 step(s))"),
}
CONSEQUENCES = ["step 1: weights after the optimizer step differ", "step 2: output differs",
                "rank 0: loss after step 2: 4.8896 vs one device 4.9424"]
OTHER_FAILURES = ["raised ValueError: Type fp16 is not supported on your device.",
                  "rank 0: died with exit code -11", "shard raised RuntimeError: shape mismatch",
                  "weight grad: shape (4, 3) != (3, 4)", "step 2: the caller's RNG state after the step differs"]


def _installed(finding: Finding) -> bool:
    return findings._in_range(finding)


def test_each_finding_has_a_watch_test_that_exists():
    for f in FINDINGS:
        path, _, name = f.watch.partition("::")
        assert (ROOT / path).is_file() and f"def {name}(" in (ROOT / path).read_text(), f.watch
        assert f.reason.endswith(".") and "\n" not in f.reason


def test_a_users_implementation_never_matches_a_finding():
    """A user's object is matched by nothing, whatever it is called or declares."""
    for spec in ("mypkg.tp:Torch", "harness.adapters.torch.tensor_parallel:TorchTensorParallel", "reference"):
        assert findings.match(spec, "tensor_parallel", [ROUNDED], row_bias=True, n=3, kind="row") is None
        assert findings.precision(spec, "tensor_parallel", kind="lm_head") is None


def test_builtin_matches_only_under_its_condition():
    if not _installed(ROWWISE):
        pytest.skip("torch outside the finding's version range")
    assert findings.match("torch", "tensor_parallel", [ROUNDED], row_bias=True, n=3, kind="row") is ROWWISE
    assert findings.match("torch", "tensor_parallel", [ROUNDED], row_bias=True, n=4, kind="row") is None
    assert findings.match("torch", "tensor_parallel", [ROUNDED], row_bias=False, n=3, kind="row") is None
    assert findings.match("torch", "tensor_parallel", [ROUNDED], kind="row") is None  # condition keys missing
    assert findings.match("torch", "zero", [ROUNDED], row_bias=True, n=3) is None


def test_version_range_is_honoured(monkeypatch):
    monkeypatch.setattr(findings, "_installed", lambda package: "2.13.0+cpu")
    assert findings._in_range(Finding("torch", "x", "torch", ("2.6", None), "r.", "w"))
    assert findings._in_range(Finding("torch", "x", "torch", ("2.13", "2.14"), "r.", "w"))
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.6", "2.13"), "r.", "w"))
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.14", None), "r.", "w"))
    monkeypatch.setattr(findings, "_installed", lambda package: None)
    assert not findings._in_range(Finding("torch", "x", "torch", ("2.6", None), "r.", "w"))


def test_a_watch_outside_its_findings_range_says_why(monkeypatch):
    watch = "suites/tensor_parallel/test_findings.py::test_dtensor_size_one_sharded_dimension_on_one_rank"
    monkeypatch.setattr(findings, "_installed", lambda package: "2.12.1")
    assert findings.outside_range(watch) == "torch 2.12.1 is outside this finding's range [2.13, not fixed)"
    monkeypatch.setattr(findings, "_installed", lambda package: "2.15.0+cu132")
    assert findings.outside_range(watch) is None
    monkeypatch.setattr(findings, "_installed", lambda package: None)
    assert findings.outside_range(watch) == "torch is not installed"
    with pytest.raises(KeyError, match="no finding is watched by 'nowhere'"):
        findings.outside_range("nowhere")


def test_no_implementation_attribute_is_read_to_excuse_or_loosen():
    pattern = re.compile(r"known_nonconformance|cross_entropy_dtype")
    offenders = [str(p.relative_to(ROOT)) for d in ("harness", "suites", "reference") for p in (ROOT / d).rglob("*.py")
                 if pattern.search(p.read_text()) and p.name != "test_findings_registry.py"]
    assert not offenders, offenders


@pytest.mark.parametrize("strict", [False, True])
def test_known_findings_xfail_and_fail_under_strict(strict):
    finding = ROWWISE
    conformance = Conformance(None, "p", strict=strict)
    conformance.record("pass")
    conformance.settle()  # nothing known: nothing happens
    conformance.record("known-nonconformance", finding=finding)
    expected = pytest.fail.Exception if strict else pytest.xfail.Exception
    with pytest.raises(expected, match="1 example\\(s\\) hit a known finding"):
        conformance.settle()


def test_findings_the_adapters_handle_excuse_nothing():
    handled = [f for f in FINDINGS if f.handled_by_adapter]
    assert len(handled) == 22 and all(not f.condition for f in handled)
    for f in handled:  # no condition to meet, yet a handled finding never matches a failure
        assert findings.match(f.impl, f.paradigm, [ROUNDED], kind="row", n=3, row_bias=False) not in handled


def test_every_matchable_finding_names_its_symptom():
    matchable = [f for f in FINDINGS if f.condition and not f.handled_by_adapter and f.precision is None]
    assert {f.watch.partition("::")[2] for f in matchable} == set(EXAMPLES)
    assert all(f.symptom for f in matchable)


@pytest.mark.parametrize("watch", sorted(EXAMPLES))
def test_a_finding_explains_only_its_own_symptom(watch, monkeypatch):
    """The finding's configuration failing with its symptom: known. The same configuration failing for
    another reason (an exception it does not name, a rank that died, another quantity wrong), or with its
    symptom and something else besides: a failure, reported as what it is."""
    monkeypatch.setattr(findings, "_in_range", lambda finding: True)  # whatever is installed here
    finding = next(f for f in FINDINGS if f.watch.endswith("::" + watch))
    case, line = EXAMPLES[watch]
    assert findings.match(finding.impl, finding.paradigm, [line], **case) is finding
    assert findings.match(finding.impl, finding.paradigm, line, **case) is finding  # one string
    assert findings.match(finding.impl, finding.paradigm, [], **case) is None  # no evidence, nothing explained
    if finding.cause:  # the cause's consequences alone are not the finding
        consequence = next(o for o in CONSEQUENCES if re.search(finding.symptom, o))
        assert findings.match(finding.impl, finding.paradigm, [consequence], **case) is None, consequence
        assert findings.match(finding.impl, finding.paradigm, [line, consequence], **case) is finding
    for other in OTHER_FAILURES:
        assert findings.match(finding.impl, finding.paradigm, [other], **case) is None, other
        assert findings.match(finding.impl, finding.paradigm, [line, other], **case) is None, other


def test_a_known_hang_is_named_only_under_its_condition_and_only_for_hangs(monkeypatch):
    """``known_hang`` skips running a case only where a finding that deadlocks applies: the same paradigm's other cases
    and every finding that does not hang are run and judged."""
    monkeypatch.setattr(findings, "_in_range", lambda finding: True)
    hang = next(f for f in FINDINGS if f.hangs)
    assert findings.known_hang(hang.impl, hang.paradigm, fp8_all_gather=True, rows_remainder=1) is hang
    assert findings.known_hang(hang.impl, hang.paradigm, fp8_all_gather=True, rows_remainder=0) is None
    assert findings.known_hang(hang.impl, hang.paradigm, fp8_all_gather=False, rows_remainder=1) is None
    assert findings.known_hang("reference", hang.paradigm, fp8_all_gather=True, rows_remainder=1) is None
    for f in FINDINGS:
        if not f.hangs and f.condition:
            case = EXAMPLES.get(f.watch.partition("::")[2], ({},))[0]
            assert findings.known_hang(f.impl, f.paradigm, **case) is None, f.watch
