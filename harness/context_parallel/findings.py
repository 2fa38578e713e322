"""The context parallel findings: the known non-conformances of third-party implementations of this paradigm
(``harness.records.findings``: what a finding is and how the suites consult it)."""

from __future__ import annotations

from harness.records.findings import Finding

FINDINGS = (
    Finding("deepspeed-ulysses", "context_parallel", "deepspeed", ("0.18.0", "0.19.8"),
            "DeepSpeed-Ulysses splits grouped-query heads whose KV count the sequence-parallel size does not divide "
            "by the query heads alone: the key and value shards do not match the query's (RuntimeError: The size "
            "of tensor a (3) must match the size of tensor b (2); minimal case: Q 6 / KV 3 heads over sp 2 — "
            "DeepSpeed issue 8291; right at 0.19.8).",
            "suites/context_parallel/test_third_party.py::test_watch_deepspeed_ulysses_uneven_kv_heads_before_the_fix",
            {"kv_remainder": lambda r: r != 0},
            symptom=r"The size of tensor a \(\d+\) must match the size of tensor b"),
)
