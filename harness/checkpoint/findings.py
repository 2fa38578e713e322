"""The checkpoint findings: the known non-conformances of third-party implementations of this paradigm
(``harness.records.findings``: what a finding is and how the suites consult it)."""

from __future__ import annotations

from harness.records.findings import Finding

FINDINGS = (
    Finding("torch-reentrant", "checkpoint", "torch", ("2.6", None),
            "torch.utils.checkpoint with use_reentrant=True and an input that does not require grad: the "
            "checkpointed segment's parameters get no gradient (every layer checkpointed: backward raises).",
            "suites/checkpoint/test_findings.py::test_reentrant_checkpoint_drops_parameter_gradients_when_the_"
            "input_needs_none", {"input_requires_grad": False},
            symptom=r"^step \d+: (parameter \d+ gradient missing|(weights|momentum) after the optimizer step differ|"
                    r"(output|input) differs)$|^forward or backward raised RuntimeError: element 0 of tensors does not "
                    r"require grad",
            cause=r"^step 1: parameter \d+ gradient missing$|^forward or backward raised RuntimeError: element 0 of "
                  r"tensors does not require grad"),
)
