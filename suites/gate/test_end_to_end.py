"""The gate on real runs: two benchmark sweeps of one implementation spec, the second with a planted bug
(a subprocess each: the bug is chosen by an environment variable that the ranks inherit), and the
report of the pair. No time is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["--ops", "all_reduce,all_gather", "--min-bytes", "1K", "--max-bytes", "4K", "--world-sizes", "2",
         "--iters", "3", "--warmup", "1"]


def bench(results: Path, planted: bool) -> str:
    env = {**os.environ, "PARITYBENCH_GATE_PLANT": "1" if planted else ""}
    out = subprocess.run([sys.executable, "-m", "harness.cli.main", "bench", "collectives", "--impl",
                          "suites.gate.planted_impl:impl", *SWEEP, "--results-dir", str(results)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_planted_bug_in_new_fails_the_gate_naming_the_case_and_the_report_shows_it(tmp_path, capsys):
    base, new = bench(tmp_path, planted=False), bench(tmp_path, planted=True)
    assert main(["compare", base, new]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("REGRESSION")]
    # the plant drops the last element of every all_gather: the exact check fails at every size
    assert any("conformance: collectives bench_exact_check suites.gate.planted_impl:impl: fails" in line
               and "smallest: n=2 float32 all_gather numel=128" in line for line in lines), out
    assert any("benchmark: collectives all_gather suites.gate.planted_impl:impl n=2 float32 bytes=1024" in line
               and "now wrong" in line for line in lines), out
    assert not any("all_reduce" in line and "benchmark" in line for line in lines)
    assert main(["report", base, new]) == 0
    report = (Path(new) / "report.md").read_text()
    assert "## Comparison with baseline" in report and "regression(s)" in report
    # the first screen: the summary before everything else, naming the failure and its cause
    summary = report[report.index("## Summary"):report.index("\n## ", report.index("## Summary") + 1)]
    assert report.index("## Summary") < report.index("## Comparison with baseline") < report.index("## Where it ran")
    assert "**not all held**" in summary and "FAIL `suites.gate.planted_impl:impl` — bench_exact_check all_gather" \
        in summary and "elements wrong" in summary, summary
    assert "## Time per section" in report and "| collectives |" in report
    assert (Path(new) / "comparison.png").stat().st_size > 0
    assert (Path(new) / "scaling.csv").exists() is False  # one world size: nothing scales
