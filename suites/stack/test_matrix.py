"""The report's per-stack conformance matrix: one row per check (the test) and case, one column per stack (the
planted bugs left out), each verdict in its cell (a case with any failing example is FAIL, whatever else it
recorded), a refusal test's case a row of its own, and every non-pass cell's reason."""

from __future__ import annotations

import io

import pandas as pd

from harness.cli.report import _md
from harness.stack.report import stack_matrix_section


def _row(impl, case, dtype, outcome, detail, prop, suite="stack"):
    return {"suite": suite, "impl": impl, "collective": case, "dtype": dtype, "outcome": outcome, "detail": detail,
            "property": prop}


def test_the_matrix_has_a_cell_per_check_case_and_stack_and_the_reasons():
    eq = "test_stack_equals_one_device"
    conf = pd.DataFrame([
        _row("reference", "llama/2x1x2/zero1/1f1b", "float64", "pass", "", f"{eq}[reference-llama]"),
        _row("torch", "llama/2x1x2/zero1/1f1b", "float64", "unsupported", "the torch stack shards with FSDP2",
             f"{eq}[torch-llama]"),
        _row("torchtitan", "llama/2x1x2/zero2/1f1b", "float32", "known-nonconformance", "tied embedding off at step 2",
             "test_torchtitan_tied_embeddings_equal_one_device[2x1x2]"),
        _row("reference", "gpt/1x1x2/zero0/1f1b", "float64", "pass", "", f"{eq}[a]"),
        _row("reference", "gpt/1x1x2/zero0/1f1b", "float64", "fail", "rank 0: step 1: parameter head.weight off",
             f"{eq}[b]"),
        _row("reference", "gpt/2x1x1/zero0/1f1b", "float64", "refused", "7 rows over dp 2",
             "test_rows_that_do_not_split[reference]"),
        _row("suites.stack.planted:KVReplicasNotSummed", "llama/1x1x2/zero0/1f1b", "float64", "fail", "k off",
             "test_kv_replicas[x]"),
        _row("reference", "stage1", "float64", "pass", "", "test_training_equals_one_device[1]", suite="zero"),
    ])
    lines = "\n".join(stack_matrix_section(conf, None, _md)).splitlines()
    assert lines[0] == "## Stacks held to one device: the conformance matrix"

    def row(check, case):
        return next(line for line in lines if line.startswith(f"| {check} ") and f"| {case} " in line)

    assert "pass" in row("stack_equals_one_device", "llama/2x1x2/zero1/1f1b")
    assert "unsupported" in row("stack_equals_one_device", "llama/2x1x2/zero1/1f1b")
    assert "finding" in row("torchtitan_tied_embeddings_equal_one_device", "llama/2x1x2/zero2/1f1b (float32)")
    assert "FAIL" in row("stack_equals_one_device", "gpt/1x1x2/zero0/1f1b")
    assert "refused" in row("rows_that_do_not_split", "gpt/2x1x1/zero0/1f1b")  # its own row, not mixed in
    text = "\n".join(lines)
    assert "the torch stack shards with FSDP2" in text and "tied embedding off at step 2" in text
    assert "KVReplicasNotSummed" not in text and "stage1" not in text  # planted bugs and other suites left out
    assert stack_matrix_section(conf[conf["suite"] == "zero"], None, _md) == []


def test_the_main_jobs_matrix_holds_each_stack_and_writes_its_rows(world_cache, tmp_path):
    """``bench matrix`` (the last stage of ``bench all``) on its 1-rank case, for our stack: a conformance row per
    stack and case, check ``matrix``, in the run folder the report draws the matrix from."""
    from harness.records.results import RunDir
    from harness.stack.matrix import MatrixSweep, cases, run_sweep

    assert len(cases()) == 22 and {layout.world_size for _, _, layout, _ in cases()} == {1, 2, 4}
    run = RunDir(tmp_path, {"suite": "matrix"})
    run.create_files()
    impls = ["reference"]
    assert run_sweep(MatrixSweep(impls=impls, sizes=[1]), world_cache.get, run, progress=io.StringIO()) == 1
    conf = pd.read_csv(run.path / "conformance.csv")
    assert list(conf["impl"]) == impls and set(conf["outcome"]) == {"pass"}, conf[["impl", "outcome", "detail"]]
    lines = "\n".join(stack_matrix_section(conf, None, _md)).splitlines()
    assert any(line.startswith("| matrix ") and "one rank" in line and line.count("| pass ") == 1
               for line in lines), lines
