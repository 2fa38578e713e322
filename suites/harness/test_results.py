"""Results: tidy CSV rows written whole and at once; a killed run keeps every finished row."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.records.results import BENCHMARK_COLUMNS, CsvAppender, ResultsError, RunDir, read_run

ROOT = Path(__file__).resolve().parents[2]


def test_appender_writes_the_header_once_and_whole_lines(tmp_path):
    path = tmp_path / "x.csv"
    a = CsvAppender(path, ["a", "b"])
    a.append({"a": 1, "b": "comma, and \"quote\""})
    a.close()
    b = CsvAppender(path, ["a", "b"])  # reopening appends, no second header
    b.append({"a": 2})
    b.close()
    text = path.read_text()
    assert text.endswith("\n") and text.count("a,b\n") == 1
    df = pd.read_csv(path)
    assert df["a"].tolist() == [1, 2] and df["b"][0] == 'comma, and "quote"'


def test_appender_rejects_columns_outside_the_schema(tmp_path):
    a = CsvAppender(tmp_path / "x.csv", ["a"])
    with pytest.raises(KeyError, match="not in the schema"):
        a.append({"a": 1, "typo": 2})


def test_run_dir_lifecycle_and_read_back(tmp_path):
    run = RunDir(tmp_path, {"suite": "t"}, run_id="r1")
    assert json.loads((run.path / "run.json").read_text())["status"] == "running"
    run.append("benchmarks.csv", {"suite": "t", "op": "x", "bytes": 8})
    run.finish()
    meta, frames = read_run(run.path)
    assert meta["status"] == "complete" and meta["torch"] and meta["python"]
    assert list(frames["benchmarks.csv"].columns) == BENCHMARK_COLUMNS
    assert frames["benchmarks.csv"]["bytes"].tolist() == [8]
    assert not any(p.name.endswith(".tmp") for p in run.path.iterdir())


def test_unwritable_results_dir_is_one_sentence(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ResultsError, match="cannot write results under"):
        RunDir(blocker / "runs", {})


def test_a_folder_without_run_json_is_not_a_run(tmp_path):
    with pytest.raises(ResultsError, match="is not a run folder"):
        read_run(tmp_path)


def test_killed_sweep_keeps_every_finished_row(tmp_path):
    """SIGKILL the whole process group mid-sweep: the CSVs parse and hold only complete rows."""
    cmd = [sys.executable, "-m", "harness.cli.main", "bench", "collectives", "--impls", "reference",
           "--ops", "all_reduce", "--world-sizes", "2", "--min-bytes", "4", "--max-bytes", "1G",
           "--factor", "2", "--iters", "2", "--warmup", "0", "--results-dir", str(tmp_path), "--no-report"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        rows = 0
        while rows < 6 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            found = list(tmp_path.glob("*/benchmarks.csv"))
            rows = found[0].read_text().count("\n") - 1 if found else 0
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert rows >= 6, "the sweep wrote too few rows in 120 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    run_dir = next(tmp_path.iterdir())
    raw = (run_dir / "benchmarks.csv").read_text()
    assert raw.endswith("\n"), "a half-written line was left behind"
    meta, frames = read_run(run_dir)
    bench = frames["benchmarks.csv"]
    assert meta["status"] == "running"  # it never finished, and says so
    sweep = bench[bench["suite"] == "collectives"]
    assert len(sweep) >= 5
    assert sweep[["bytes", "time_p50_us", "busbw_gbps", "wrong", "status"]].notna().all().all()
    assert (sweep["status"] == "ok").all() and (sweep["wrong"] == 0).all()
    assert sweep["bytes"].tolist() == [4 * 2**i for i in range(len(sweep))]  # in order, none lost
    assert len(frames["conformance.csv"]) >= len(sweep) - 1  # written right after each bench row


def test_run_json_records_where_each_rank_ran(world_cache, world_sizes, tmp_path):
    from harness.runtime import placement
    from harness.runtime import spmd_runtime as spmd

    if spmd.active():
        pytest.skip("under torchrun placement is tested by test_multinode (nodes, GROUP_RANK)")
    n = max(world_sizes)
    run = RunDir(tmp_path, {"suite": "t"})
    placement.record(run, world_cache.get(n))
    meta = json.loads((run.path / "run.json").read_text())
    ranks = meta["placement"][str(n)]["ranks"]
    assert meta["launcher"] == "world" and meta["nodes"] == 1 and meta["backends"] == [world_cache.get(n).backend]
    assert [(r["rank"], r["local_rank"], r["node"]) for r in ranks] == [(r, r, 0) for r in range(n)]
    assert meta["hosts"] == [socket.gethostname()] and {r["host"] for r in ranks} == {socket.gethostname()}
    assert placement.summarize([{**ranks[0], "host": "a"}, {**ranks[0], "host": "b"}])["nodes"] == 2


def test_hashed_host_names(monkeypatch):
    from harness.runtime import placement

    monkeypatch.setenv("PARITYBENCH_HASH_HOSTS", "1")
    name = placement._host()
    assert name.startswith("sha256:") and len(name) == 19 and socket.gethostname() not in name
