"""``paritybench compare``: verdicts, exit codes and output on synthetic run folders (no timing measured)."""

from __future__ import annotations

import json

import pytest

from harness.cli.main import main

from .runs import bench_row, conf_row, standard, write_run


def compare(capsys, *args) -> tuple[int, str, str]:
    rc = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def regressions(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("REGRESSION")]


def test_the_same_sweep_twice_is_no_regression(tmp_path, capsys):
    rc, out, _ = compare(capsys, standard(tmp_path, seed=1), standard(tmp_path, seed=2))
    assert rc == 0 and not regressions(out)
    assert "0 regression(s)" in out and "8 unchanged" in out


def test_a_slower_case_is_named_with_its_ratio_and_interval(tmp_path, capsys):
    bench = [bench_row(), bench_row(n=4), bench_row(n=4, nbytes=4 << 20, median_us=1500.0)]
    base = write_run(tmp_path, [bench_row(), bench_row(n=4), bench_row(n=4, nbytes=4 << 20)], seed=1)
    rc, out, _ = compare(capsys, base, write_run(tmp_path, bench, seed=2))
    assert rc == 1
    (line,) = regressions(out)
    assert "collectives all_reduce torch n=4 float32 sum bytes=4194304" in line and ": slower x1." in line
    ratio = float(line.split(" x")[1].split()[0])
    assert 1.4 < ratio < 1.6


def test_a_change_inside_the_threshold_or_a_faster_case_passes(tmp_path, capsys):
    base = write_run(tmp_path, [bench_row(), bench_row(n=4)], seed=1)
    new = write_run(tmp_path, [bench_row(median_us=1050.0), bench_row(n=4, median_us=500.0)], seed=2)
    rc, out, _ = compare(capsys, base, new)
    assert rc == 0
    assert "faster" in out and "1 faster" in out


def test_a_smaller_threshold_flags_what_the_default_lets_pass(tmp_path, capsys):
    base = write_run(tmp_path, [bench_row()], seed=1)
    new = write_run(tmp_path, [bench_row(median_us=1060.0)], seed=2)
    assert compare(capsys, base, new)[0] == 0
    assert compare(capsys, base, new, "--time-threshold", "2%")[0] == 1


def test_a_case_that_passed_and_now_fails_names_the_smallest_failing_example(tmp_path, capsys):
    conf = [conf_row(n=2 + i % 3, numel=i) for i in range(10)]
    bad = conf[:6] + [conf_row(n=4, numel=100, outcome="fail", detail="rank 1: x[3] = 7, expected 8"),
                      conf_row(n=3, numel=9, outcome="fail", detail="rank 2: x[0] = 1, expected 2"),
                      conf_row(n=3, numel=40, outcome="error", detail="oracle")] + conf[9:]
    rc, out, _ = compare(capsys, standard(tmp_path, seed=1), standard(tmp_path, seed=2, conf=bad))
    assert rc == 1
    (line,) = regressions(out)
    assert "REGRESSION conformance: collectives test_x[torch] torch: fails: 3 failing example(s)" in line
    assert "smallest: n=3 float32 all_reduce sum numel=9 root=0 in_place=False seed=1: fail: rank 2: x[0] = 1" in line


def test_a_known_finding_that_used_to_pass_is_a_regression_and_one_that_failed_before_is_not(tmp_path,
                                                                                                   capsys):
    known = [conf_row(numel=1, outcome="known-nonconformance", detail="known finding: gloo")]
    base_ok, base_known = write_run(tmp_path, conf=[conf_row(numel=1)]), write_run(tmp_path, conf=known)
    assert compare(capsys, base_ok, write_run(tmp_path, conf=known))[0] == 1
    rc, out, _ = compare(capsys, base_known, write_run(tmp_path, conf=known))
    assert rc == 0 and "still failing" in out


@pytest.mark.parametrize(("change", "verdict"), [
    ("thinner", "thinner: 9 example(s) per run, the baseline ran at least 10"),
    ("missing", "missing: ran 10 example(s) per run in the baseline; none now"),
    ("unsupported", "now unsupported: 1 case(s) that passed are now unsupported or refused")])
def test_a_silently_thinner_suite_is_a_regression(tmp_path, capsys, change, verdict):
    conf = [conf_row(n=2 + i % 3, numel=i) for i in range(10)]
    other = [conf_row(prop="test_y[torch]", numel=i) for i in range(3)]
    new = {"thinner": conf[:9], "missing": [],
           "unsupported": conf[:9] + [{**conf[9], "outcome": "unsupported", "wrong": 0}]}[change]
    rc, out, _ = compare(capsys, write_run(tmp_path, conf=conf + other), write_run(tmp_path, conf=new + other))
    assert rc == 1
    assert any(verdict in line for line in regressions(out)), out


@pytest.mark.parametrize(("new_status", "verdict"), [("wrong", "now wrong"), ("failed", "now failed"),
                                                     ("unsupported", "now unsupported"),
                                                     (None, "missing")])
def test_a_benchmark_case_that_ran_and_now_does_not_is_a_regression(tmp_path, capsys, new_status, verdict):
    base = write_run(tmp_path, [bench_row(), bench_row(n=4)])
    second = [] if new_status is None else [bench_row(n=4, status=new_status, wrong=5 if new_status == "wrong" else 0,
                                                      detail="rank 0: x[1] = 3, expected 4")]
    rc, out, _ = compare(capsys, base, write_run(tmp_path, [bench_row()] + second))
    assert rc == 1
    (line,) = regressions(out)
    assert f"n=4 float32 sum bytes=1048576 count=262144: {verdict}" in line


@pytest.mark.parametrize(("column", "delta", "regressed"), [
    ("comm_bytes_measured", 1, True), ("comm_bytes_measured", -1024, False), ("mem_optimizer_bytes", 8, True),
    ("bubble_simulated", 1e-9, True), ("act_peak_bytes", 0, False)])
def test_deterministic_figures_compare_exactly(tmp_path, capsys, column, delta, regressed):
    value = 0.25 if column == "bubble_simulated" else 1 << 20
    base = write_run(tmp_path, [bench_row(**{column: value})])
    rc, out, _ = compare(capsys, base, write_run(tmp_path, [bench_row(**{column: value + delta})]))
    assert rc == int(regressed)
    assert (f"{column}: larger" in out) == regressed


def test_a_figure_measured_before_and_blank_now_is_a_regression(tmp_path, capsys):
    base = write_run(tmp_path, [bench_row(comm_bytes_measured=4096)])
    rc, out, _ = compare(capsys, base, write_run(tmp_path, [bench_row()]))
    assert rc == 1 and "comm_bytes_measured: no longer measured" in out


@pytest.mark.parametrize(("meta", "phrase"), [
    ({"backend": "nccl", "backends": ["nccl"]}, "backend gloo vs nccl"),
    ({"gpus": ["NVIDIA H100 80GB HBM3"]}, "device"),
    ({"placement": {"2": {}, "8": {}}}, "world sizes [2, 4] vs [2, 8]"),
    ({"config": {"collectives": {"hidden": 256, "iters": 50}}}, "collectives setting hidden 512 vs 256")])
def test_runs_from_different_environments_are_refused_unless_allowed(tmp_path, capsys, meta, phrase):
    base, new = standard(tmp_path), standard(tmp_path, meta=meta)
    rc, out, err = compare(capsys, base, new)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and phrase in err and "--allow-env-change" in err
    rc, out, _ = compare(capsys, base, new, "--allow-env-change")
    assert rc == 0 and f"environment differs (allowed): {phrase}" in out


def test_iteration_counts_and_versions_may_differ_and_are_shown(tmp_path, capsys):
    base = standard(tmp_path)
    new = standard(tmp_path, meta={"torch": "9.9.9", "config": {"collectives": {"hidden": 512, "iters": 50}}})
    rc, out, _ = compare(capsys, base, new)
    assert rc == 0 and "versions: torch" in out and "-> 9.9.9" in out


def test_bad_input_is_one_sentence_and_exit_2(tmp_path, capsys):
    good = standard(tmp_path)
    running = write_run(tmp_path, [bench_row()], status="running")
    other = write_run(tmp_path, [bench_row(op="all_to_all")], conf=[conf_row(prop="test_other")])
    (tmp_path / "empty").mkdir()
    cases = [
        ((tmp_path / "empty", good), "is not a run folder"),
        ((good, running), "that is running"),
        ((good, other), "have no case in common"),
        ((good, good, "--time-threshold", "0.1"), "must be a percentage above 0"),
        ((good, good, "--time-threshold=-5%"), "must be a percentage above 0"),
        ((good, good, "--time-threshold", "ten%"), "must be a percentage above 0"),
        ((good, good, "--confidence", "1.5"), "--confidence 1.5 must be"),
    ]
    for args, phrase in cases:
        rc, out, err = compare(capsys, *args)
        assert rc == 2 and out == "", args
        assert err.startswith("paritybench: error: ") and err.count("\n") == 1 and phrase in err, (args, err)


def test_markdown_lists_regressions_first_and_json_carries_every_record(tmp_path, capsys):
    base = write_run(tmp_path, [bench_row(), bench_row(n=4), bench_row(op="broadcast")], seed=1)
    new = write_run(tmp_path, [bench_row(median_us=1300.0), bench_row(n=4, median_us=2000.0),
                               bench_row(op="broadcast", median_us=400.0)], seed=2)
    rc, out, _ = compare(capsys, base, new, "--format", "markdown")
    assert rc == 1 and out.startswith("### paritybench: ❌ **regression**")
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["**slower**", "**slower**", "faster"]
    assert "n=4" in rows[0]  # worst first: x2.0 before x1.3
    rc, out, _ = compare(capsys, base, new, "--format", "json", "--output", tmp_path / "gate.json")
    data = json.loads(out)
    assert json.loads((tmp_path / "gate.json").read_text()) == data
    assert data["summary"]["regressions"] == 2 and len(data["records"]) == 3  # the 3 times
    assert {r["verdict"] for r in data["records"] if r["kind"] == "time"} == {"slower", "faster"}


def test_a_version_1_run_without_samples_is_read_and_its_times_not_judged(tmp_path, capsys):
    base = write_run(tmp_path, [bench_row(samples_us=[])])
    rc, out, _ = compare(capsys, base, write_run(tmp_path, [bench_row()]))
    assert rc == 0 and "not judged" in out


def _runs_with_effects(tmp_path, effects: list[float], cases: int = 1, spread: float = 0.02, seed: int = 0,
                       per_case: list[list[float]] | None = None) -> list[str]:
    """One run folder per run effect: every case's times around 1000 us x effect (x a per-case factor)."""
    out = []
    for i, effect in enumerate(effects):
        rows = [bench_row(nbytes=(1 + c) << 20, median_us=1000.0 * effect * (per_case[i][c] if per_case else 1.0))
                for c in range(cases)]
        out.append(write_run(tmp_path / "runs", rows, seed=seed + i))
    return out


def test_a_baseline_of_several_runs_judges_times_between_runs(tmp_path, capsys):
    """Runs that differ by +-15 % (as this project's 2-core runner does) make a 30 % slower run unremarkable
    between runs, while a one-run baseline, judged over iterations, flags it; 3x is flagged either way
    (d = log 3 = 1.10 against t(3 dof, 0.995) = 5.84 x s 0.12 x sqrt(1/4 + 1) = 0.78, beyond log 1.1)."""
    runs = _runs_with_effects(tmp_path, [0.85, 1.0, 1.15, 1.0])
    main(["baseline", *runs, "--out", str(tmp_path / "b")])
    (new,) = _runs_with_effects(tmp_path, [1.3], seed=50)
    (double,) = _runs_with_effects(tmp_path, [3.0], seed=60)
    capsys.readouterr()
    assert main(["compare", runs[1], new]) == 1
    assert "note: times judged over iterations: the baseline holds one run" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "b"), new, "--format", "json"]) == 0
    (rec,) = [r for r in json.loads(capsys.readouterr().out)["records"] if r["kind"] == "time"]
    assert rec["method"] == "between runs (4 vs 1)" and rec["verdict"] in ("unchanged", "inconclusive")
    assert rec["low"] < 1.1 < rec["high"]
    assert main(["compare", str(tmp_path / "b"), double]) == 1
    assert "slower" in capsys.readouterr().out


def test_a_slowdown_spread_over_every_case_is_caught_by_the_aggregate(tmp_path, capsys):
    """Eight cases whose run medians vary by 12 % each but not together (case c of run i: x exp(0.12 s),
    s = -1, 0, 1 by (i + c) mod 3): no single case's interval (t(4 dof) = 4.6 x ~0.1 x 1.1 = 0.5) can clear
    log 1.1 from d <= log 1.4 + 0.12, but the mean over the cases moves by ~1 % between runs and a run 40 %
    slower in every case is flagged by the implementation's aggregate."""
    import math

    factors = [[math.exp(0.12 * ((i + c) % 3 - 1)) for c in range(8)] for i in range(6)]
    runs = _runs_with_effects(tmp_path, [1.0] * 5, cases=8, per_case=factors[:5])
    main(["baseline", *runs, "--out", str(tmp_path / "b")])
    (new,) = _runs_with_effects(tmp_path, [1.4], cases=8, per_case=factors[5:], seed=70)
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "b"), new, "--format", "json"]) == 1
    records = json.loads(capsys.readouterr().out)["records"]
    (agg,) = [r for r in records if r.get("method") == "aggregate between runs"]
    assert agg["regression"] and agg["case"] == "collectives torch gloo (all 8 timed cases)"
    assert 1.25 < agg["ratio"] < 1.6
    assert not [r for r in records if r["regression"] and r is not agg]


def test_a_run_is_no_regression_of_itself_where_one_key_holds_passing_and_failing_examples(tmp_path, capsys):
    """A property whose recorded columns do not tell its examples apart (the checkpointing suite) holds one key
    with both outcomes; the same rows again are 'still failing', not a regression."""
    conf = [conf_row(numel=2), conf_row(numel=2, outcome="known-nonconformance", detail="known finding: x"),
            conf_row(numel=3)]
    run = write_run(tmp_path, conf=conf)
    rc, out, _ = compare(capsys, run, run)
    assert rc == 0 and "still failing" in out
    worse = write_run(tmp_path, conf=conf + [conf_row(numel=3, outcome="fail", detail="x[0] = 1, expected 2")])
    rc, out, _ = compare(capsys, run, worse)
    assert rc == 1 and "smallest: n=2 float32 all_reduce sum numel=3" in out
