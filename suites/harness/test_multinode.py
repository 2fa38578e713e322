"""Two torchrun "nodes" on this machine (c10d rendezvous on loopback) run one sweep into one run folder,
whose run.json says how many nodes took part and which rank ran where. The command line is the one
docs/guides/multi-node.md gives for real nodes, with the endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.cli.report import write_report
from harness.runtime import spmd_runtime as spmd

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]
# torchrun's flags as the docs give them for real nodes (docs/guides/multi-node.md, docs/multinode/slurm.sbatch)
FLAGS = ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.thorough  # the tox budget: 10 s of two torchrun nodes (the slowest non-corner case)
def test_two_nodes_write_one_run_folder_with_placement(tmp_path):
    if spmd.under_torchrun():
        pytest.skip("already inside a torchrun job: this test launches its own")
    port = _free_port()
    # no --world-sizes: auto is the torchrun job's size (2 nodes x 2 processes = 4)
    sweep = ["paritybench", "bench", "collectives", "--impls", "reference,torch",
             "--ops", "all_reduce,all_gather", "--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2",
             "--warmup", "1", "--results-dir", str(tmp_path), "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    values = ("2", "2", "c10d", f"127.0.0.1:{port}", f"pb{port}")
    launch = [a for flag, value in zip(FLAGS, values, strict=True) for a in (flag, value)]
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "harness.runtime.spmd", *sweep]
    nodes = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    logs = []
    for proc in nodes:
        try:
            logs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in nodes:
                p.kill()
            raise
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    runs = list(tmp_path.iterdir())
    assert len(runs) == 1, f"expected one run folder (rank 0 writes it), got {runs}"
    meta = json.loads((runs[0] / "run.json").read_text())
    assert meta["status"] == "complete" and meta["launcher"] == "torchrun" and meta["backend"] == "gloo"
    assert meta["nodes"] == 2 and meta["hosts"] == [socket.gethostname()]
    ranks = meta["placement"]["4"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert sorted((r["node"], r["local_rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    rows = pd.read_csv(runs[0] / "benchmarks.csv")
    rows = rows[rows["impl"] != "world"]  # the World's own dispatch-cost row
    assert set(rows["world_size"]) == {4} and set(rows["impl"]) == {"reference", "torch"}
    assert len(rows) == 2 * 2 * 2 and (rows["wrong"] == 0).all(), rows[["impl", "op", "bytes", "wrong"]]
    report = write_report(runs[0]).read_text()
    host = socket.gethostname()
    assert f"- **world 4**: node 0 `{host}`: ranks 0,1; node 1 `{host}`: ranks 2,3 (cpu)" in report, report[:1500]


def test_documented_launch_lines_are_the_tested_form():
    """Every torchrun line of the multi-node docs uses exactly the flags the test above runs."""
    for path in ("docs/guides/multi-node.md", "docs/multinode/slurm.sbatch"):
        text = (ROOT / path).read_text().replace("\\\n", " ")
        lines = [line for line in text.splitlines() if "torchrun --" in line]
        assert lines, f"{path} has no torchrun command line"
        for line in lines:
            launch = line[line.index("torchrun"):line.index(" -m harness.runtime.spmd")]
            flags = tuple(t for t in launch.split() if t.startswith("--"))
            assert flags == FLAGS, f"{path}: {launch}"
            assert "--rdzv-backend c10d" in launch
    job = (ROOT / "docs/multinode/pytorchjob.yaml").read_text()
    assert '"-m", "harness.runtime.spmd"' in job and "rdzvBackend: c10d" in job
