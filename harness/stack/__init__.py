"""Whole stacks (a trainer: dp x pp x tp x cp x ep, ZeRO, recipes) held to one device: the case, the layout sweep, the
conformance matrix and their report sections. Its ``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.registry import ImplSpec

from .findings import FINDINGS

PARADIGM = Paradigm(
    "stack", 6, contract="harness.contracts.stack:Stack",
    builtins=(
        ImplSpec("reference", "stack", "harness.adapters.reference.stack:ReferenceStack",
                 description="ours: reference.stack.compose.Parallel3D (TP, CP, pipeline, DP / ZeRO 0-2), GPT and "
                             "Llama"),
        ImplSpec("deepspeed", "stack", "harness.adapters.deepspeed.stack:DeepSpeedStack", requires=("deepspeed",),
                 description="DeepSpeed's engine: ZeRO 0-3 over dp, its accumulation and clipping (float32)"),
        ImplSpec("torchtitan", "stack", "harness.adapters.torchtitan.stack:TorchtitanStack",
                 requires=("torchtitan", "spmd_types", "tyro", "einops"),
                 description="torchtitan's Llama3Model + parallelize_llama (TP/SP, FSDP2 / replicate, AC), float32"),
        ImplSpec("megatron", "stack", "harness.adapters.megatron.stack:MegatronStack", requires=("megatron.core",),
                 description="megatron-core's GPTModel (local spec) + TP/SP, 1F1B / interleaved, DDP / distributed "
                             "optimizer (float32)"),
        ImplSpec("torch", "stack", "harness.adapters.torch.stack:TorchStack",
                 requires=("torch.distributed.pipelining", "torch.distributed.fsdp"),
                 description="torchtitan-style: DTensor TP + pipelining + FSDP2, GPT and Llama"),
        ImplSpec("accelerate", "stack", "harness.adapters.accelerate.stack:AccelerateStack", requires=("accelerate",),
                 description="Hugging Face accelerate: Accelerator + DDP / its FSDP2 plugin (accelerators only), "
                             "accumulate, backward, clip_grad_norm_"),
    ),
    options=(("harness.adapters.deepspeed.stack:CallerScalesLoss", "deepspeed"),
             ("harness.adapters.deepspeed.stack:Fp32GradAccum", "deepspeed"),
             ("harness.adapters.deepspeed.stack:ZeroInit", "deepspeed"),
             ("harness.adapters.deepspeed.stack:Hpz", "deepspeed"),
             ("harness.adapters.deepspeed.stack:Offload", "deepspeed"),
             ("harness.adapters.torch.stack:ReshardToPairs", "torch"),
             ("harness.adapters.torch.stack:CpuOffload", "torch"),
             ("harness.adapters.torchtitan.stack:CpuOffload", "torchtitan"),
             ("harness.adapters.megatron.stack:OverlapGradReduce", "megatron")),
    findings=FINDINGS,
    benches=(
        Bench("stack", "every dp x pp x tp layout of one world size per stack and family (through the stack "
                       "contract): step time, tokens/s, model state and bytes per rank vs plan",
              "harness.stack.cli:plans", "harness.stack.cli:add_arguments", in_all=5, calibrated=True,
              own_world_size="its layouts' world size is --stack-world-size (8)", iters=3, warmup=1,
              all_iters=2),
        Bench("matrix", "every installed stack held to one device over one fixed set of cases (layouts, "
                        "schedules, seams): the conformance matrix of the report",
              "harness.stack.cli:matrix_plans", in_all=6),
    ),
    sections=(Section(70, "harness.stack.report:stack_section", suite="stack"),
              Section(950, "harness.stack.report:stack_matrix_section", source="conformance.csv"),),
    headlines="harness.stack.report:headlines",
)
