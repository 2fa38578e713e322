"""``paritybench calibrate`` and ``plan --profile`` end to end: a real (tiny) calibration sweep on the
session's 2-rank World fitted into a profile, a pipeline sweep predicted with it, the report's sections,
and every bad input refused with one sentence and exit 2. No timing is asserted."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main
from harness.cli.report import write_report
from harness.cost_model.build import profile_from_run
from harness.cost_model.predict import PARTS
from harness.cost_model.report import planner_summary
from harness.cost_model.sweep import CalibrationSweep, run_sweep
from harness.pipeline.bench import PipelineSweep
from harness.pipeline.bench import run_sweep as pipeline_sweep
from harness.records.results import RunDir, read_run

from .synthetic import profile

TINY = CalibrationSweep(world_sizes=[2], sizes=[256, 4096], shapes=[(4, 8, 8)], iters=2, warmup=0,
                        blocks=[{"kind": "gpt_block", "hidden": 8, "heads": 2, "ffn": 16, "seq": 4, "rows": 2},
                                {"kind": "mlp_layer", "hidden": 8, "rows": 4}])
PLAN = ["plan", "--params", "1.7M", "--hidden", "128", "--heads", "8", "--layers", "8", "--seq", "64", "--batch",
        "2", "--microbatches", "4", "--vocab", "512", "--ffn", "512", "--dp", "8"]


@pytest.fixture(scope="module")
def calibrated(world_cache, world_sizes, tmp_path_factory):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    run = RunDir(tmp_path_factory.mktemp("calibrate"), {"suite": "calibrate"})
    rows = run_sweep(TINY, world_cache.get, run, progress=None)
    run.finish()
    return run, rows


def test_sweep_rows_fit_into_a_profile(calibrated, tmp_path, capsys):
    run, rows = calibrated
    _, frames = read_run(run.path)
    cal = frames["calibration.csv"]
    assert rows == len(cal) == 4 * 2 + 3 * 2 + 1 + 2  # collectives x sizes, p2p (send, one way, loaded) x sizes,
    # compute (matmul and the two layers)
    assert (cal["time_p50_us"] > 0).all() and set(cal["kind"]) == {"collective", "p2p", "compute"}
    prof = profile_from_run(run.path)
    assert prof.backend == run.meta.get("backend", prof.backend) and prof.world_sizes == [2]
    assert all(e["alpha_s"] >= 0 and e["beta_s_per_byte"] >= 0 for e in prof.collectives + prof.p2p)
    assert prof.flops_per_s("float32", 2) > 0 and prof.layer_overhead("mlp_layer", "float32", 2) is not None
    out = tmp_path / "p.json"
    assert main(["calibrate", "--from", str(run.path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["world_sizes"] == [2] and "all_reduce g=2 of 2" in capsys.readouterr().out


def test_pipeline_rows_carry_the_prediction_and_the_report_shows_it(calibrated, world_cache, tmp_path):
    run, _ = calibrated
    prof_path = profile_from_run(run.path).save(tmp_path / "p.json")
    cfg = PipelineSweep(impls=["reference"], schedules=["gpipe", "zb-h1"], world_sizes=[2], microbatches=[2], hidden=8,
                        rows_per_microbatch=4, iters=2, warmup=0, profile=str(prof_path))
    out = RunDir(tmp_path, {"suite": "pipeline"})
    pipeline_sweep(cfg, world_cache.get, out, progress=None)
    out.finish()
    rows = read_run(out.path)[1]["benchmarks.csv"]
    assert rows["time_planned_us"].gt(0).all() and rows["bubble_planned"].between(0, 1).all()
    parts = rows[[f"plan_{k[:-2]}_us" for k in PARTS]].sum(axis=1)
    assert (parts - rows["time_planned_us"]).abs().max() <= 1e-9 * rows["time_planned_us"].max()
    report = write_report(out.path).read_text()
    assert "## Planner: predicted vs measured" in report and "Pipeline bubble: planned" in report
    assert (out.path / "planner.png").stat().st_size > 1000
    report = write_report(run.path).read_text()
    assert "## Calibration: the machine profile" in report and (run.path / "calibration.png").stat().st_size > 1000


def test_plan_ranks_every_layout_by_predicted_time(tmp_path, capsys):
    path = profile(8, overhead=1e-3).save(tmp_path / "p.json")
    assert main([*PLAN, "--profile", str(path), "--device-memory", "1GB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ranked = out["layouts_by_predicted_time"]
    times = [e["predicted_s"]["step_s"] for e in ranked]
    assert times == sorted(times) and len(ranked) == 10 * 4  # 10 (dp, pp, tp) layouts x ZeRO 0-3
    assert all(e["fits"] is True for e in ranked)
    for e in ranked:
        assert e["predicted_s"]["step_s"] == pytest.approx(sum(e["predicted_s"][k] for k in PARTS), rel=1e-12)
    assert out["predicted_s"]["step_s"] > 0  # the asked layout (8x1x1) too
    assert main([*PLAN, "--profile", str(path)]) == 0
    assert "ranked by predicted step time" in capsys.readouterr().out


def test_planner_summary():
    import pandas as pd

    rows = pd.DataFrame({"op": ["a", "b", "c"], "time_p50_us": [100.0, 200.0, 300.0],
                         "time_planned_us": [250.0, 150.0, 360.0]})
    s = planner_summary(rows)
    assert s["spearman"] == pytest.approx(0.5) and s["median_error"] == pytest.approx(0.25)
    assert s["planned_first"] == "b" and s["top1_gap"] == pytest.approx(1.0) and s["measured_best"] == "a"


def test_resolved_pairs_judge_only_what_the_measurement_orders():
    """a and b overlap (unresolved); c is resolved from both; the plan orders (a, c) as measured and (b, c)
    the other way: tau 0 over 2 resolved pairs; a and b are tied for best, so the plan's first (b) is met
    although its median is not the best."""
    import pandas as pd

    from harness.cost_model.report import resolved_summary

    rows = pd.DataFrame({"op": ["a", "b", "c"], "time_p50_us": [100.0, 105.0, 300.0],
                         "time_ci_lo_us": [90.0, 95.0, 280.0], "time_ci_hi_us": [110.0, 120.0, 320.0],
                         "time_ci_level": [0.9375] * 3, "time_planned_us": [200.0, 90.0, 150.0]})
    r = resolved_summary(rows)
    assert (r["pairs"], r["unresolved"], r["concordant"], r["discordant"]) == (3, 1, 1, 1)
    assert r["kendall"] == 0.0 and r["tied_for_best"] == ["a", "b"] and r["planned_first"] == "b" and r["first_tied"]
    rows["time_ci_hi_us"] = [400.0] * 3  # nothing resolved: nothing judged
    r = resolved_summary(rows)
    assert r["kendall"] is None and r["unresolved"] == 3 and r["tied_for_best"] == ["a", "b", "c"]
    assert resolved_summary(rows.drop(columns=["time_ci_lo_us"])) == {}  # a run without intervals


def test_bubble_judgement():
    from harness.cost_model.report import bubble_judgement

    row = {"bubble_measured": 0.40, "bubble_ci_lo": 0.30, "bubble_ci_hi": 0.55}
    assert bubble_judgement({**row, "bubble_planned": 0.45}) == "within"  # 12.5 % off
    assert bubble_judgement({**row, "bubble_planned": 0.52}) == "unresolved"  # 30 % off, inside the spread
    assert bubble_judgement({**row, "bubble_planned": 0.60}) == "missed"
    assert bubble_judgement({"bubble_measured": 0.4, "bubble_planned": 0.6}) == "missed"  # no interval recorded


def test_median_interval_coverage():
    from harness.runtime.timing import median_interval

    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0, 0.9375)
    assert median_interval([float(i) for i in range(10)]) == (1.0, 8.0, pytest.approx(0.978515625))
    lo, hi, level = median_interval([float(i) for i in range(40)], 0.95)
    assert level >= 0.95 and (lo, hi) == (13.0, 26.0)  # n = 40: the 14th and 27th order statistics
    assert median_interval([2.0, 1.0]) == (1.0, 2.0, 0.5)  # too few for 90 %: the coverage it has


@pytest.mark.parametrize("argv, needle", [
    (["--backend", "nccl"], "measured on backend 'gloo', the plan asks for 'nccl'"),
    (["--dp", "4"], "measured at world size(s) 8, the plan asks for 4 ranks"),
])
def test_plan_refuses_a_profile_of_another_machine(tmp_path, capsys, argv, needle):
    path = profile(8).save(tmp_path / "p.json")
    args = PLAN[:-2] if "--dp" in argv else PLAN  # PLAN ends with --dp 8
    assert main([*args, "--profile", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_bad_inputs_exit_2_with_one_sentence(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    assert main([*PLAN, "--profile", str(tmp_path / "bad.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    bare = RunDir(tmp_path / "runs", {"suite": "collectives"})
    bare.finish()
    assert main(["calibrate", "--from", str(bare.path), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "no calibration measurements" in err and "paritybench calibrate --out" in err and err.count("\n") == 1
    assert main(["calibrate", "--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "p.json")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    path = profile(8).save(tmp_path / "p8.json")
    assert main(["bench", "3d", "--3d-world-size", "4", "--profile", str(path), "--results-dir",
                 str(tmp_path / "r")]) == 2
    assert "the plan asks for 4 ranks" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["calibrate", "--out", str(tmp_path / "x.json"), "--iters", "1"]) == 2
    assert "--iters must be >= 2" in capsys.readouterr().err


def test_plan_ranks_context_parallel_layouts_by_predicted_time(tmp_path, capsys):
    """``plan --cp 2 --profile``: every layout of the 8 ranks at cp = 2, each with its cp exchange."""
    path = profile(8, overhead=1e-3).save(tmp_path / "p.json")
    argv = [a if a != "8" or i != len(PLAN) - 1 else "4" for i, a in enumerate(PLAN)]  # dp 4 x cp 2
    assert main([*argv, "--cp", "2", "--cp-algorithm", "ulysses", "--profile", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ranked = out["layouts_by_predicted_time"]
    assert ranked and all(e["layout"]["cp"] == 2 for e in ranked)
    assert all(e["predicted_s"]["cp_s"] > 0 for e in ranked)
    assert out["predicted_s"]["cp_s"] > 0 and out["layout"]["cp"] == 2
    assert main([*argv, "--cp", "2", "--profile", str(path)]) == 0
    assert "cp comm" in capsys.readouterr().out


def test_plan_ranks_expert_parallel_layouts_by_predicted_time(tmp_path, capsys):
    """``plan --experts 8 --ep 4 --profile``: every layout of the 8 ranks whose dp x cp ep divides, each with its
    dispatch and combine exchange."""
    path = profile(8, overhead=1e-3).save(tmp_path / "p.json")
    argv = [*PLAN, "--experts", "8", "--ep", "4", "--expert-ffn", "64", "--profile", str(path)]
    assert main([*argv, "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["layouts_by_predicted_time"]
    assert ranked and all(e["layout"]["ep"] == 4 and e["layout"]["dp"] % 4 == 0 for e in ranked)
    assert all(e["predicted_s"]["ep_s"] > 0 for e in ranked)
    assert main(argv) == 0
    assert "ep comm" in capsys.readouterr().out
