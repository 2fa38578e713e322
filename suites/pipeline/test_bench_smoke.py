"""The pipeline benchmark and its report section run end to end on a tiny model. No timings asserted."""

from __future__ import annotations

import pytest

from harness.cli.report import write_report
from harness.pipeline.bench import PipelineSweep, run_sweep
from harness.records.results import RunDir, read_run


def test_pipeline_sweep_rows_plots_and_report(world_cache, world_sizes, tmp_path):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    schedules = ["gpipe", "interleaved", "zbv", "dualpipev"]
    cfg = PipelineSweep(schedules=schedules, world_sizes=[2], microbatches=[1, 3], hidden=8, rows_per_microbatch=2,
                        iters=2, warmup=1)
    run = RunDir(tmp_path, {"suite": "pipeline"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2 * 4 * 2
    run.finish()
    _, frames = read_run(run.path)
    rows = frames["benchmarks.csv"]
    ours = rows[rows["impl"] == "reference"]
    timed = ours[ours["status"] == "ok"]  # ours runs every schedule at every m (interleaved: one round of m)
    assert len(timed) == 8 and timed["bubble_measured"].between(0, 1).all()
    # the activations the runtime held at once are the simulator's, exactly: the order on a rank fixes them
    assert (timed["peak_activations_measured"] == timed["peak_activations_simulated"]).all()
    v_rows = timed[timed["op"].isin(["zbv", "dualpipev"])]
    assert (v_rows["virtual_stages"] == 2).all()
    assert timed["bubble_predicted"].between(0, 1).all() and (timed["time_p50_us"] > 0).all()
    # the step-to-step interval of the bubble the planner is judged within
    assert timed["bubble_measured"].between(timed["bubble_ci_lo"], timed["bubble_ci_hi"]).all()
    # the deterministic figure the gate compares exactly: GPipe's unit-cost bubble is (p - 1) / (m + p - 1)
    gpipe = timed[timed["op"] == "gpipe"]
    assert sorted(gpipe["bubble_simulated"]) == [pytest.approx(1 / 4), pytest.approx(1 / 2)]
    samples = frames["samples.csv"]
    assert len(samples) == 2 * len(rows[rows["status"] == "ok"])  # every timed iteration of every row
    torch_rows = rows[rows["impl"] == "torch"]
    assert set(torch_rows["status"]) <= {"ok", "unsupported"} and torch_rows["bubble_measured"].isna().all()
    # torch's DualPipeV needs m >= 2p stages' worth of microbatches: unsupported, with torch's own sentence
    refused = torch_rows[(torch_rows["op"] == "dualpipev")]
    assert (refused["status"] == "unsupported").all() and refused["detail"].str.contains("DualPipeV requires").all()
    for _, r in timed.iterrows():
        stem = f"pipeline_reference_{r['op']}_p2_m{r['microbatches']}"
        assert (run.path / f"{stem}_measured.png").stat().st_size > 1000
        assert (run.path / f"{stem}_simulated.png").stat().st_size > 1000
    report = write_report(run.path).read_text()
    assert "## Pipeline: step time and bubble" in report and "bubble_measured" in report
