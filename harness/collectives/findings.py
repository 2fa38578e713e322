"""The collectives findings: the known non-conformances of third-party implementations of this paradigm
(``harness.records.findings``: what a finding is and how the suites consult it)."""

from __future__ import annotations

from harness.records.findings import Finding

FINDINGS = (
    Finding("torch", "collectives", "torch", ("2.13", None),
            "torch.distributed.all_to_all_single with the output aliasing the input returns blocks in the wrong "
            "places on gloo, silently and intermittently (16 of 20 calls wrong at 1 element per block, 2 ranks).",
            "suites/collectives/test_findings.py::test_torch_all_to_all_single_in_place_still_corrupts",
            handled_by_adapter="the torch adapter declares in-place all_to_all unsupported"),
)
