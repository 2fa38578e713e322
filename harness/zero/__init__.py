"""Data parallelism and ZeRO 1-3: the training case, the stage sweep and its report section. Its ``PARADIGM`` record is
what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "zero", 5, contract="harness.contracts.zero:Zero",
    builtins=(
        ImplSpec("reference", "zero", "reference.zero.adapter:ReferenceZero",
                 description="ours: bucketed DP, flat-buffer ZeRO-1/2, per-module ZeRO-3"),
        ImplSpec("reference-naive", "zero", "reference.zero.adapter:ReferenceZero", {"bucketed": False},
                 only_ops=("stage0",), description="ours; one all-reduce per gradient after backward"),
        ImplSpec("torch", "zero", "harness.adapters.torch.zero:TorchZero", requires=("torch.distributed.fsdp",),
                 description="DDP, ZeroRedundancyOptimizer, FSDP2 fully_shard"),
        ImplSpec("deepspeed", "zero", "harness.adapters.deepspeed.zero:DeepSpeedZero", requires=("deepspeed",),
                 description="DeepSpeed ZeRO stages 0-3 on CPU/gloo"),
    ),
    findings=(
        Finding("deepspeed", "zero", "deepspeed", ("0.15", None),
                "DeepSpeed's default gradient_clipping is 1.0: a config that does not mention clipping silently clips "
                "the gradient norm to 1 (Linear(4, 1), input 3 * ones: norm 6 applied as 1).",
                "suites/zero/test_findings.py::test_deepspeed_clips_gradients_by_default",
                handled_by_adapter="the deepspeed adapter sets gradient_clipping 0"),
        Finding("deepspeed", "zero", "deepspeed", ("0.19", None),
                "ds_to_universal, DeepSpeed's only way to resume a ZeRO 1-3 checkpoint at another DP size, assumes "
                "Adam's optimizer state: a checkpoint trained with SGD + momentum fails to convert with KeyError "
                "'exp_avg' (mlp, ZeRO-2, dp 2, 2 steps); with Adam it converts and resumes at dp 4 exactly.",
                "suites/resume/test_deepspeed.py::test_universal_conversion_of_an_sgd_checkpoint_fails",
                {"optimizer": "sgd", "universal": True}, symptom=r"KeyError: 'exp_avg'"),
        Finding("deepspeed", "zero", "deepspeed", ("0.19", None),
                "fp16 at ZeRO stage 0 (a client torch optimizer, wrapped in FP16_UnfusedOptimizer): engine.backward "
                "scales the loss only for a ZeROOptimizer, yet the step divides the gradients by the loss scale — "
                "every update is 2^initial_scale_power times too small and no overflow is ever seen, so the scale "
                "keeps growing (mlp, dp 2, initial_scale_power 18: the fp32 masters moved 5e-8 in 3 steps, 1e-2 in "
                "fp32).",
                "suites/mixed_precision/test_third_party.py::test_deepspeed_fp16_stage0_never_scales_the_loss",
                {"precision": "fp16", "stage": 0},
                symptom=r"^rank \d+: (parameter \d+ off by [^ ]+ > |loss scaler \{'scale': [0-9.]+, 'skipped': 0\} "
                        r"!= one device's )"),
        Finding("deepspeed", "zero", "deepspeed", ("0.19", None),
                "fp16 at ZeRO 1-3: the dynamic loss scale is updated before the gradients are unscaled, so on a step "
                "where the scale grows the gradients are divided by the doubled scale and that update is halved "
                "(mlp, dp 2, ZeRO 1, initial_scale_power 14, loss_scale_window 2: equal to one device after 2 steps, "
                "off by 1.6e-3 vs the bound 1.4e-4 after the 3rd, where the scale grows).",
                "suites/mixed_precision/test_third_party.py::test_deepspeed_fp16_halves_the_update_when_the_scale_grows",
                {"precision": "fp16", "stage": lambda s: s in (1, 2, 3), "scale_grew": True},
                symptom=r"^rank \d+: parameter \d+ off by [^ ]+ > "),
        Finding("torch", "zero", "torch", ("2.13", None),
                "torch.nn.utils.get_total_norm / clip_grads_with_norm_ (torchtitan's clip_grad_norm_) raise 'All "
                "operands in aten.stack.default must have the same mesh' when some gradients are DTensors on the "
                "(dp, tp) mesh (TP layers under FSDP2) and others on the dp mesh only (LayerNorms FSDP-sharded, not "
                "TP'd); minimal case: the torch 3D stack at 1x1x2 with max_norm set. Norms and clipping per mesh, "
                "combined, equal one device.",
                "suites/threed/test_torch_stack.py::test_torchtitan_clip_recipe_cannot_mix_meshes",
                handled_by_adapter="the torch 3D adapter clips per device mesh (clip_recipe 'per-mesh')"),
    ),
    benches=(
        Bench("zero", "step time, memory per rank and bytes per DP / ZeRO stage",
              "harness.zero.cli:plans", "harness.zero.cli:add_arguments", in_all=3, all_iters=6),
    ),
    sections=(Section(40, "harness.zero.report:zero_section", suite="zero"),),
)
