"""Context parallelism (ring, Ulysses): the attention case, the sequence sweep and its report section. Its ``PARADIGM``
record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec

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
    findings=(
        Finding("deepspeed-ulysses", "context_parallel", "deepspeed", ("0.18.0", "0.19.8"),
                "DeepSpeed-Ulysses splits grouped-query heads whose KV count the sequence-parallel size does not "
                "divide by the query heads alone: the key and value shards do not match the query's (RuntimeError: The "
                "size of tensor a (3) must match the size of tensor b (2); minimal case: Q 6 / KV 3 heads over sp 2 — "
                "DeepSpeed issue 8291; right at 0.19.8).",
                "suites/context_parallel/test_third_party.py::test_watch_deepspeed_ulysses_uneven_kv_heads_before_the_fix",
                {"kv_remainder": lambda r: r != 0},
                symptom=r"The size of tensor a \(\d+\) must match the size of tensor b"),
    ),
    benches=(
        Bench("context_parallel", "one attention layer per implementation vs sequence length and cp: time "
                                  "and bytes per rank vs the cost model",
              "harness.context_parallel.cli:plans", "harness.context_parallel.cli:add_arguments", iters=5,
              warmup=1),
    ),
    sections=(Section(50, "harness.context_parallel.bench:context_parallel_section", suite="context_parallel"),),
)
