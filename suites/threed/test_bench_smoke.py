"""The 3D benchmark runs end to end on a tiny GPT over 2 ranks (no timings asserted): every layout
runs, the measured bubble is a fraction, larger for the pipeline layout than for the others, and the
model-state memory of the pure data-parallel layout is the cost model's up to the flat buffer's padding."""

from __future__ import annotations

import pandas as pd

from harness.cli.report import write_report
from harness.records.results import RunDir, read_run
from harness.threed.bench import ThreeDSweep, run_sweep

from ..planner.synthetic import profile


def test_3d_sweep_and_report(world_cache, tmp_path):
    cfg = ThreeDSweep(world_size=2, vocab=13, hidden=16, heads=8, ffn=32, layers=2, seq=4, rows=1, iters=2, warmup=0,
                      profile=str(profile(2, overhead=1e-3).save(tmp_path / "profile.json")))
    run = RunDir(tmp_path, {"suite": "3d"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 3
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"].set_index("op")
    assert set(rows.index) == {"1x1x2", "1x2x1", "2x1x1"} and (rows["status"] == "ok").all()
    assert ((rows["bubble_measured"] >= 0) & (rows["bubble_measured"] < 1)).all()
    assert rows.loc["1x2x1", "bubble_measured"] > rows.loc["2x1x1", "bubble_measured"]  # only gaps between ops
    dp = rows.loc["2x1x1"]
    for kind in ("params", "grads", "optimizer"):  # < 2 padding elements of 4 bytes (x2 for a full buffer)
        assert abs(dp[f"mem_{kind}_bytes"] - dp[f"mem_{kind}_predicted"]) <= 8, kind
    # every layout carries the planner's prediction, equal to its parts
    parts = rows[[f"plan_{k}_us" for k in ("compute", "tp", "pp", "bubble", "dp", "sync")]].sum(axis=1)
    assert (rows["time_planned_us"] > 0).all() and ((parts - rows["time_planned_us"]).abs() < 1e-6).all()
    # interleaved rounds: every round's step kept, the median inside its interval at the stated coverage
    assert (rows["rounds"] == 2).all() and (rows["time_ci_level"] == 0.5).all()
    assert ((rows["time_ci_lo_us"] <= rows["time_p50_us"]) & (rows["time_p50_us"] <= rows["time_ci_hi_us"])).all()
    report = write_report(run.path).read_text()
    assert "## 3D layouts: measured beside predicted" in report and "Spearman rank correlation" in report
    assert "layout pairs have measured intervals at 50% confidence that do not overlap" in report
    assert "tied for best" in report
    assert "### Mixed precision and clipping per layout" not in report  # opt-in variants only


def test_rounds_interleave_the_layouts(world_cache, tmp_path):
    """Round 1 steps every layout once, then round 2: the progress lines name layouts in that order."""
    import io

    cfg = ThreeDSweep(world_size=2, vocab=13, hidden=16, heads=8, ffn=32, layers=2, seq=4, rows=1, iters=3, warmup=1,
                      layouts=[(2, 1, 1), (1, 2, 1)])
    progress = io.StringIO()
    run_sweep(cfg, world_cache.get, RunDir(tmp_path, {"suite": "3d"}), progress=progress)
    lines = [line for line in progress.getvalue().splitlines() if line.startswith("[round")]
    order = [line.split("] 3d ")[1].split()[0] for line in lines]
    assert order == ["2x1x1", "1x2x1"] * 3, order


def test_3d_variants_rows_and_memory(world_cache, tmp_path):
    cfg = ThreeDSweep(world_size=2, vocab=13, hidden=16, heads=8, ffn=32, layers=2, seq=4, rows=1, iters=1, warmup=0,
                      layouts=[(2, 1, 1)], variants=["plain", "bf16", "clip"])
    run = RunDir(tmp_path, {"suite": "3d"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 3
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    rows = rows.set_index([rows["op"], rows["dtype"]])
    assert set(rows.index) == {("2x1x1", "float32"), ("2x1x1", "bfloat16"), ("2x1x1+clip", "float32")}
    bf16 = rows.loc[("2x1x1", "bfloat16")]
    for kind in ("params", "grads", "optimizer"):  # bf16 weights and grads, fp32 master + momentum (K = 8)
        assert abs(bf16[f"mem_{kind}_bytes"] - bf16[f"mem_{kind}_predicted"]) <= 16, kind
    assert bf16["mem_optimizer_predicted"] == 2 * bf16["mem_params_predicted"]  # ZeRO 1 over 2: 8 / 2 vs 2
    report = write_report(run.path).read_text()
    assert "### Mixed precision and clipping per layout" in report


def test_bad_3d_variants_are_one_sentence(capsys):
    from harness.cli.main import main

    assert main(["bench", "3d", "--3d-variants", "bf16,fp8"]) == 2
    assert "--3d-variants 'bf16,fp8' must be comma-separated among plain, bf16, clip." in capsys.readouterr().err


def test_a_layout_that_raises_is_a_failed_row_and_the_others_go_on(world_cache, tmp_path):
    """Two pipeline stages of a one-layer GPT cannot be partitioned: that layout raises on every rank in the first
    round — its row is failed with the ranks' verdict, the World is respawned, and the layout before it, rebuilt
    there in the second round, and the one after it are still measured (before: the sweep ended)."""
    import io

    cfg = ThreeDSweep(world_size=2, vocab=13, hidden=16, heads=8, ffn=32, layers=1, seq=4, rows=1, iters=2, warmup=1,
                      layouts=[(2, 1, 1), (1, 2, 1), (1, 1, 2)])
    run, progress = RunDir(tmp_path, {"suite": "3d"}), io.StringIO()
    assert run_sweep(cfg, world_cache.get, run, progress=progress) == 3
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"].set_index("op")
    assert rows["status"].to_dict() == {"2x1x1": "ok", "1x2x1": "failed", "1x1x2": "ok"}
    failed = rows.loc["1x2x1"]
    assert "pp (2) cannot exceed the number of layers (1)" in failed["detail"] and pd.isna(failed["time_p50_us"])
    assert (rows.loc[["2x1x1", "1x1x2"], "rounds"] == 2).all()
    asked = [line.split("] 3d ")[1].rsplit(":", 1)[0] for line in progress.getvalue().splitlines()
             if line.startswith("[round")]
    assert asked == ["2x1x1 plain", "1x2x1 plain", "1x1x2 plain", "2x1x1 plain", "1x1x2 plain"], asked
    assert "[round 1/2, 2/3] 3d 1x2x1 plain: failed" in progress.getvalue()
