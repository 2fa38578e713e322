"""The pipeline findings: the known non-conformances of third-party implementations of this paradigm
(``harness.records.findings``: what a finding is and how the suites consult it)."""

from __future__ import annotations

from harness.records.findings import Finding

FINDINGS = (
    Finding("torch", "pipeline", "torch", ("2.13", None),
            "torch.distributed.pipelining raises on unequal microbatches (a batch of 7 in 2 microbatches), while "
            "the contract splits with tensor_split.",
            "suites/pipeline/test_findings.py::test_torch_pipelining_still_raises_on_unequal_microbatches",
            handled_by_adapter="the torch pipeline adapter declares unequal microbatches unsupported"),
)
