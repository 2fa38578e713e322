"""The report's per-stack conformance matrix: one row per case, one column per stack, each verdict in its cell
(a case with any failing example is FAIL, whatever else it recorded), and every non-pass cell's reason."""

from __future__ import annotations

import pandas as pd

from harness.report import _md
from harness.stack.report import stack_matrix_section


def test_the_matrix_has_a_cell_per_case_and_stack_and_the_reasons():
    conf = pd.DataFrame([
        {"suite": "stack", "impl": "reference", "collective": "llama/2x1x2/zero1/1f1b", "dtype": "float64",
         "outcome": "pass", "detail": ""},
        {"suite": "stack", "impl": "torch", "collective": "llama/2x1x2/zero1/1f1b", "dtype": "float64",
         "outcome": "unsupported", "detail": "the torch stack shards with FSDP2"},
        {"suite": "stack", "impl": "torchtitan", "collective": "llama/2x1x2/zero2/1f1b", "dtype": "float32",
         "outcome": "known-nonconformance", "detail": "tied embedding off at step 2"},
        {"suite": "stack", "impl": "reference", "collective": "gpt/1x1x2/zero0/1f1b", "dtype": "float64",
         "outcome": "pass", "detail": ""},
        {"suite": "stack", "impl": "reference", "collective": "gpt/1x1x2/zero0/1f1b", "dtype": "float64",
         "outcome": "fail", "detail": "rank 0: step 1: parameter head.weight off"},
        {"suite": "zero", "impl": "reference", "collective": "stage1", "dtype": "float64", "outcome": "pass",
         "detail": ""},
    ])
    text = "\n".join(stack_matrix_section(conf, _md))
    assert "## Stacks held to one device: the conformance matrix" in text
    row = next(line for line in text.splitlines() if line.startswith("| llama/2x1x2/zero1/1f1b "))
    assert "pass" in row and "unsupported" in row
    assert "finding" in next(line for line in text.splitlines() if "llama/2x1x2/zero2/1f1b (float32)" in line)
    assert "FAIL" in next(line for line in text.splitlines() if line.startswith("| gpt/1x1x2/zero0/1f1b"))
    assert "the torch stack shards with FSDP2" in text and "tied embedding off at step 2" in text
    assert "stage1" not in text  # only the stack suite's rows
    assert stack_matrix_section(conf[conf["suite"] == "zero"], _md) == []
