"""Under torchrun the same suites run unchanged: rank 0 drives, the others follow (harness.runtime.spmd)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.runtime import spmd_runtime as spmd

from .ranks import pid

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]


def test_suite_runs_under_torchrun_with_rank_zero_driving(tmp_path):
    if spmd.under_torchrun():
        return  # already inside a torchrun job: this test launches its own
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "harness.runtime.spmd", "pytest", "-q", "-p", "no:cacheprovider", "--world-sizes", "2",
           "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle[reference-all_reduce]",
           "suites/harness/test_world.py::test_run_returns_results_indexed_by_rank",
           "suites/harness/test_spmd.py::test_rank_zero_is_the_driver_only_under_torchrun",
           f"--results-dir={tmp_path}"]
    env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "ci", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "2 passed, 1 skipped" in log, log[-3000:]  # test_world is skipped there: it kills ranks
    rows = pd.read_csv(next(tmp_path.glob("*/conformance.csv")))
    assert len(rows) >= 10 and (rows["world_size"] == 2).all()
    assert set(rows["outcome"]) <= {"pass", "unsupported"} and (rows["outcome"] == "pass").sum() >= 10


def test_rank_zero_is_the_driver_only_under_torchrun(world_cache, world_sizes):
    """Under torchrun rank 0's calls run in the driving process itself; otherwise every rank is spawned."""
    pids = world_cache.get(max(world_sizes)).run(pid)
    assert len(set(pids)) == len(pids)
    assert (pids[0] == os.getpid()) == spmd.active()
