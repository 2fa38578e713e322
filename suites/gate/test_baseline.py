"""``paritybench baseline``: runs merged into one run folder that compare, report and read_run accept."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli.main import main
from harness.records.results import read_run

from .runs import bench_row, conf_row, standard, write_run


def test_repeats_merge_into_a_baseline_whose_samples_are_pooled(tmp_path, capsys):
    runs = [standard(tmp_path / "runs", seed=s) for s in range(3)]
    out = tmp_path / "baselines" / "main"
    assert main(["baseline", *runs, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    meta, frames = read_run(out)
    assert meta["kind"] == "baseline" and meta["status"] == "complete" and len(meta["runs"]) == 3
    assert len(frames["benchmarks.csv"]) == 3 * 8 and len(frames["conformance.csv"]) == 30
    assert frames["samples.csv"]["run_id"].nunique() == 3
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    rc = main(["compare", str(out), standard(tmp_path / "runs", seed=9), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["header"]["baseline_runs"] == 3
    times = [r for r in data["records"] if r["kind"] == "time" and r.get("method") != "aggregate between runs"]
    assert {(r["base_n"], r["new_n"], r["method"]) for r in times} == {(60, 20, "between runs (3 vs 1)")}
    (agg,) = [r for r in data["records"] if r.get("method") == "aggregate between runs"]
    assert agg["case"] == "collectives torch gloo (all 8 timed cases)" and agg["verdict"] == "unchanged"
    (prop,) = [r for r in data["records"] if r["kind"] == "conformance"]
    assert prop["verdict"] == "ok" and prop["detail"] == "10 example(s) per run"  # per run, not 30


def test_a_thinner_run_against_a_merged_baseline_is_still_caught(tmp_path, capsys):
    runs = [standard(tmp_path / "runs", seed=s) for s in range(2)]
    main(["baseline", *runs, "--out", str(tmp_path / "b")])
    thin = standard(tmp_path / "runs", conf=[conf_row(n=2, numel=i) for i in range(9)])
    assert main(["compare", str(tmp_path / "b"), thin]) == 1
    assert "thinner: 9 example(s) per run, the baseline ran at least 10" in capsys.readouterr().out


def test_parts_of_one_run_join_without_halving_their_counts(tmp_path, capsys):
    """A CI job writes the suites' run folder (pytest) and the sweep's (bench); joined, each property
    keeps its count and compare takes the pair as one run."""
    suites = write_run(tmp_path / "a", conf=[conf_row(numel=i) for i in range(10)], meta={"placement": {"2": {}}})
    sweep = write_run(tmp_path / "a", [bench_row(), bench_row(n=4)])
    main(["baseline", suites, sweep, "--out", str(tmp_path / "joined")])
    suites2 = write_run(tmp_path / "b", conf=[conf_row(numel=i) for i in range(10)], meta={"placement": {"2": {}}})
    sweep2 = write_run(tmp_path / "b", [bench_row(), bench_row(n=4)], seed=3)
    main(["baseline", suites2, sweep2, "--out", str(tmp_path / "joined2")])
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "joined"), str(tmp_path / "joined2")]) == 0
    assert "0 regression(s) in 3 judged item(s); times: 2 unchanged." in capsys.readouterr().out


def test_bad_input(tmp_path, capsys):
    run = standard(tmp_path / "runs")
    running = write_run(tmp_path / "runs", [bench_row()], status="running")
    nccl = standard(tmp_path / "runs", meta={"backend": "nccl", "backends": ["nccl"]})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for args, phrase in [([run, run], "the same run is given twice"),
                         ([run, running], "that is running"),
                         ([run, nccl], "ran in different environments (backend gloo vs nccl)"),
                         ([run, str(tmp_path / "nothing")], "is not a run folder")]:
        assert main(["baseline", *args, "--out", str(tmp_path / "new")]) == 2
        err = capsys.readouterr().err
        assert phrase in err and err.count("\n") == 1, err
        assert not Path(tmp_path / "new").exists()
    assert main(["baseline", run, "--out", str(tmp_path / "full")]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
