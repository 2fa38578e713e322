"""Data parallelism and ZeRO 1-3: the training case, the stage sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

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
    findings=FINDINGS,
    benches=(
        Bench("zero", "step time, memory per rank and bytes per DP / ZeRO stage",
              "harness.zero.cli:plans", "harness.zero.cli:add_arguments", in_all=3),
    ),
    sections=(Section(40, "harness.zero.report:zero_section", suite="zero"),),
)
