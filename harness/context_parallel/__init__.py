"""Context parallelism (ring, Ulysses): the attention case, the sequence sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "context_parallel", 7, contract="harness.contracts.context_parallel:ContextParallel",
    builtins=(
        ImplSpec("reference-ring", "context_parallel", "reference.context_parallel:ReferenceContextParallel",
                 {"algorithm": "ring"}, description="ours: ring attention (pass-KV, online softmax, blockwise bwd)"),
        ImplSpec("reference-ulysses", "context_parallel", "reference.context_parallel:ReferenceContextParallel",
                 {"algorithm": "ulysses"}, description="ours: Ulysses all-to-all over heads (GQA split / replicated)"),
        ImplSpec("deepspeed-ulysses", "context_parallel", "harness.adapters.deepspeed.ulysses:DeepSpeedUlysses",
                 requires=("deepspeed",), description="DeepSpeed-Ulysses DistributedAttention on CPU/gloo"),
        ImplSpec("ring-flash-attn", "context_parallel",
                 "harness.adapters.flash_attn.context_parallel:FlashContextParallel",
                 {"package": "ring-flash-attn"}, requires=("ring_flash_attn", "flash_attn"),
                 description="ring-flash-attn (zigzag ring over flash-attn; CUDA, fp16 / bf16 only)"),
        ImplSpec("yunchang", "context_parallel", "harness.adapters.flash_attn.context_parallel:FlashContextParallel",
                 {"package": "yunchang"}, requires=("yunchang", "flash_attn"),
                 description="yunchang LongContextAttention (hybrid Ulysses x ring over flash-attn; CUDA only)"),
    ),
    findings=FINDINGS,
    benches=(
        Bench("context_parallel", "one attention layer per implementation vs sequence length and cp: time "
                                  "and bytes per rank vs the cost model",
              "harness.context_parallel.cli:plans", "harness.context_parallel.cli:add_arguments"),
    ),
    sections=(Section(50, "harness.context_parallel.bench:context_parallel_section", suite="context_parallel"),),
)
