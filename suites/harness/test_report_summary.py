"""report.md opens with its summary: the conformance counts and every failure's cause, what was not judged,
the time — each line linking a section the report has (``harness.cli.summary``)."""

from __future__ import annotations

import re

from harness.cli.report import write_report
from harness.cli.summary import anchor
from harness.records.results import RunDir

ROWS = [
    {"suite": "stack", "property": "test_stack_equals_one_device", "impl": "mystack", "collective": "gpt/2x1x1",
     "world_size": 2, "dtype": "float64", "outcome": "pass"},
    {"suite": "stack", "property": "test_stack_equals_one_device", "impl": "mystack", "collective": "gpt/1x2x1",
     "world_size": 2, "dtype": "float64", "outcome": "fail",
     "detail": "rank 1: step 2: blocks.0.mlp.weight off by 3e-3 = 40 E_T\nsecond line"},
    {"suite": "stack", "property": "test_stack_equals_one_device", "impl": "mystack", "collective": "gpt/1x1x2",
     "world_size": 2, "dtype": "float64", "outcome": "fail",
     "detail": "rank 1: step 2: blocks.0.mlp.weight off by 3e-3 = 40 E_T"},
    {"suite": "stack", "property": "test_stack_equals_one_device", "impl": "torch", "collective": "llama/1x1x8",
     "world_size": 8, "dtype": "float64", "outcome": "unsupported", "detail": "torch splits 4 KV heads over tp 8."},
    {"suite": "stack", "property": "test_stack_equals_one_device", "impl": "torch", "collective": "gpt/2x1x1",
     "world_size": 2, "dtype": "float64", "outcome": "known-nonconformance", "detail": "known finding: X."},
]


BENCH = [
    {"suite": "zero", "op": "stage1", "impl": "mytrainer", "world_size": 2, "status": "failed",
     "detail": "rank 1: ValueError: bucket size (rank(s) [1] of 2 raised during bench_rank)\nsecond line"},
    {"suite": "zero", "op": "stage2", "impl": "mytrainer", "world_size": 2, "status": "failed",
     "detail": "rank 1: ValueError: bucket size (rank(s) [1] of 2 raised during bench_rank)"},
    {"suite": "zero", "op": "stage1", "impl": "reference", "world_size": 2, "status": "ok", "time_p50_us": 5.0},
    {"suite": "low_precision", "op": "float8-rowwise/row", "impl": "torchtitan", "world_size": 2, "status": "wrong",
     "time_p50_us": 7.0, "wrong": 1, "detail": "known finding: trains tensorwise. | rank 0: step 0: off by 1e7 u32"},
    {"suite": "collectives", "op": "all_reduce", "impl": "mycoll", "world_size": 2, "bytes": 1024, "status": "wrong",
     "time_p50_us": 3.0, "wrong": 256, "detail": "256 of 256 elements wrong"},
]


def _report(tmp_path) -> str:
    run = RunDir(tmp_path, {"suite": "stack"})
    for row in ROWS:
        run.append("conformance.csv", row)
    for row in BENCH:
        run.append("benchmarks.csv", row)
    run.update(sections=[{"section": "stack", "seconds": 30.0}, {"section": "matrix", "seconds": 10.0},
                         {"section": "stack", "seconds": 20.0}])
    run.finish()
    return write_report(run.path).read_text()


def test_the_report_opens_with_the_summary_and_every_link_lands(tmp_path):
    report = _report(tmp_path)
    lines = report.splitlines()
    assert lines[0].startswith("# paritybench report") and lines[2] == "## Summary", lines[:3]
    summary = report[report.index("## Summary"):report.index("## Where it ran")]
    assert ("5 rows over 2 implementations — 1 pass, 2 fail, 1 known-nonconformance, 1 unsupported: "
            "**not all held**.") in summary, summary
    # the two failures with one cause are one line, its first line only
    assert ("  - FAIL `mystack` — test_stack_equals_one_device gpt/1x2x1 n=2 (+1 rows): rank 1: step 2: "
            "blocks.0.mlp.weight off by 3e-3 = 40 E_T") in summary.splitlines(), summary
    assert "second line" not in summary and "  - finding `torch` — " in summary
    assert "  - stack `torch` (1): torch splits 4 KV heads over tp 8." in summary.splitlines()
    assert "1.0 min of sections; the longest stack 30 s" in summary  # the longest single sweep
    # the benchmark cases an implementation raised in: one line per cause, and the section listing each case
    assert ("  - zero `mytrainer` (2): rank 1: ValueError: bucket size (rank(s) [1] of 2 raised during bench_rank)"
            in summary.splitlines()), summary
    assert "- **Failed cases** ([table](#failed-cases)): 2 benchmark rows" in summary
    # the cases that ran but are wrong — a collective's wrong elements, a suite's verdict (a known finding named) —
    # their own line per cause, and the section listing each across suites (before: no word in the summary)
    assert "- **Wrong results** ([table](#wrong-results)): 2 benchmark rows that ran but whose result" in summary
    assert "  - low_precision `torchtitan` (1): known finding: trains tensorwise. | rank 0: step 0: off by 1e7 u32" \
        in summary.splitlines() and "  - collectives `mycoll` (1): 256 of 256 elements wrong" in summary.splitlines()
    wrong = report[report.index("## Wrong results"):].split("\n## ")[0]
    assert "| low_precision | torchtitan |" in wrong and "| collectives   | mycoll     |" in wrong, wrong
    assert "mytrainer" not in wrong and "reference" not in wrong, wrong
    failed = report[report.index("## Failed cases"):]
    assert failed.count("| zero    | mytrainer |") == 2 and "reference" not in failed.split("\n## ")[0], failed
    anchors = {anchor(line) for line in lines if line.startswith("#")}
    links = re.findall(r"\]\(#([^)]+)\)", summary)
    assert links and set(links) <= anchors, (links, anchors)
    table = report[report.index("## Time per section"):]
    assert re.search(r"\| stack\s+\|\s+50 \|", table) and re.search(r"\| matrix\s+\|\s+10 \|", table), table


def test_anchors_are_githubs():
    assert anchor("## Reference vs native (busbw ratio)") == "reference-vs-native-busbw-ratio"
    assert anchor("### Pipeline bubble: planned (from the profile) vs measured (the runtime's timestamps)") == \
        "pipeline-bubble-planned-from-the-profile-vs-measured-the-runtimes-timestamps"
    assert anchor("## Stacks held to one device: the conformance matrix") == \
        "stacks-held-to-one-device-the-conformance-matrix"
