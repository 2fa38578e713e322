"""``pytest -n 2`` (pytest-xdist): each worker has its own Worlds (private FileStore rendezvous), and
``--results-dir`` gives one consistent run folder that compare and report accept; ``--impl`` checks and
the per-suite summary still work on the controller."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.cli.main import main
from harness.records.results import read_run

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

pytest.importorskip("xdist", reason="pytest-xdist is not installed (it comes with the test extra)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.thorough  # the tox budget: 11 s of subprocesses (the slowest non-corner case)
def test_two_workers_write_one_run_folder(tmp_path, capsys):
    env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "dev"}
    args = ["-n", "2", "-v", "suites/collectives/test_conformance.py", "-k",
            "test_collective_matches and (all_gather or broadcast or reduce_scatter)", "--impl", "torch",
            "--world-sizes", "2,3", "--results-dir", str(tmp_path)]
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "[gw0]" in out.stdout and "[gw1]" in out.stdout and "3 passed" in out.stdout
    assert ("paritybench: time per suite (each test's own seconds, summed over 2 workers running side by side): "
            "collectives") in out.stdout and "Worlds spawned (size 2: 2, size 3: 2)" in \
        out.stdout  # each worker spawned its own
    (run,) = list(tmp_path.iterdir())
    meta, frames = read_run(run)
    conf = frames["conformance.csv"]
    assert meta["status"] == "complete" and sorted(meta["placement"]) == ["2", "3"]
    # every property's rows are there: its corner table and the dev profile's 25 examples, passing or
    # declared unsupported (torch: integer AVG)
    assert conf["property"].nunique() == 3 and conf.groupby("property").size().min() >= 25
    assert set(conf["outcome"]) <= {"pass", "unsupported"} and (conf["outcome"] == "pass").sum() >= 60
    assert (run / "conformance.csv").read_text().count("schema_version,") == 1  # one header, no torn lines
    assert pd.read_csv(run / "conformance.csv")["run_id"].eq(run.name).all()
    assert main(["compare", str(run), str(run)]) == 0
    assert "0 regression(s)" in capsys.readouterr().out
