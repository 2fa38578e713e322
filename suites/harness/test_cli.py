"""The CLI: every bad input is one sentence on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from harness.cli.main import main, parse_bytes


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("argv, needle", [
    (["bench", "collectives", "--impls", "nccl-magic"], "unknown implementation 'nccl-magic'"),
    (["bench", "collectives", "--impl", "my pkg:obj"], "malformed implementation 'my pkg:obj'"),
    (["bench", "collectives", "--impl", "no_such_module_xyz:Impl"], "cannot import module 'no_such_module_xyz'"),
    (["bench", "collectives", "--impl", "harness.cli.main:NotThere"], "has no attribute 'NotThere'"),
    (["bench", "collectives", "--impl", "harness.runtime.world:rank_device"], "lacks all_gather"),
    (["bench", "collectives", "--impls", "reference", "--world-sizes", "0"], "at least 1"),
    (["bench", "collectives", "--impls", "reference", "--world-sizes", "two"], "whole numbers"),
    (["bench", "collectives", "--impls", "reference", "--min-bytes", "64M", "--max-bytes", "1M"],
     "--min-bytes (67108864) must be at least 1 and at most --max-bytes (1048576)"),
    (["bench", "collectives", "--impls", "reference", "--max-bytes", "12 parsecs"], "is not a byte count"),
    (["bench", "collectives", "--impls", "reference", "--factor", "1"], "--factor must be"),
    (["bench", "collectives", "--impls", "reference", "--ops", "all_reduce,gossip"], "gossip not known"),
    (["bench", "collectives", "--impls", "reference", "--iters", "0"], "--iters must be >= 1"),
    (["bench", "collectives", "--dtype", "float8"], "invalid choice: 'float8'"),
    (["bench", "telepathy"], "invalid choice: 'telepathy'"),
    (["bench", "pipeline", "--microbatches", "2,x"], "--microbatches '2,x' must be comma-separated"),
    (["bench", "pipeline", "--schedules", "1f1b,pipedream"], "schedule(s) pipedream not known"),
    (["bench", "pipeline", "--impls", "reference-rhd"], "is a collectives implementation, not pipeline"),
    (["bench", "all", "--virtual-stages", "0"], "--virtual-stages and --hidden must be >= 1"),
    (["bench", "tensor_parallel", "--ffn", "0"], "--hidden, --ffn, --seq and --batch must be >= 1"),
    (["bench", "zero", "--stages", "0,5"], "--stages '0,5' must be comma-separated ZeRO stages among 0, 1, 2, 3."),
    (["bench", "zero", "--impls", "megatron"], "is a tensor_parallel and stack implementation, not zero"),
    (["bench", "zero", "--zero-hidden", "0"], "--zero-hidden must be >= 1"),
    (["bench", "checkpoint", "--layers", "4,x"], "--layers '4,x' must be comma-separated whole numbers >= 1."),
    (["bench", "checkpoint", "--policies", "sqrt,everything"], "polic(ies) everything not known"),
    (["bench", "3d", "--3d-world-size", "0"], "--3d-world-size must be >= 1; got 0."),
    (["bench", "3d", "--3d-zero", "3"], "invalid choice: 3"),
    (["bench", "3d", "--impls", "torch"], "bench 3d measures the reference stack's GPT only: it takes no --impls"),
    (["bench", "stack", "--families", "gpt,mamba"], "famil(ies) mamba not known; choose from gpt, llama."),
    (["bench", "stack", "--stack-world-size", "0"], "--stack-world-size must be >= 1; got 0."),
    (["bench", "stack", "--stack-layouts", "2x2"], "layout '2x2' must be dpxppxtp"),
    (["bench", "stack", "--stack-layouts", "2x2x4"], "each must be dpxppxtp of 8 ranks that the model allows"),
    (["bench", "stack", "--impls", "reference-rhd"], "is a collectives implementation, not stack"),
    (["bench", "all", "--families", "moe"], "famil(ies) moe not known"),
    (["bench", "stack", "--world-sizes", "2"],
     "bench stack does not take --world-sizes ('2'): its layouts' world size is --stack-world-size (8)."),
    (["bench", "3d", "--world-sizes", "4"], "bench 3d does not take --world-sizes ('4'): its layouts' world size is"),
    (["bench", "low_precision", "--world-sizes", "2,4"], "each layout runs on its own 2 ranks"),
    (["bench", "checkpoint", "--world-sizes", "2"],
     "bench checkpoint does not take --world-sizes ('2'): it runs in this process, on no ranks."),
    (["bench", "matrix", "--world-sizes", "3"], "no case of the matrix runs at --world-sizes '3'; its cases run at"),
    (["bench", "context_parallel", "--seqs", "256,x"], "--seqs '256,x' must be comma-separated whole numbers"),
    (["bench", "context_parallel", "--seqs", "6", "--world-sizes", "2"], "6 tokens do not split into the 2 cp chunks"),
    ([], "the following arguments are required"),
    (["bench", "collectives", "--backend", "nccl", "--impls", "reference"], "--backend nccl needs CUDA devices"),
])
def test_bad_input_is_one_sentence_and_exit_2(capsys, argv, needle):
    code, err = run_cli(capsys, *argv)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and err.startswith("paritybench: error: ") and "Traceback" not in err


def test_unwritable_results_dir(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = run_cli(capsys, "bench", "collectives", "--impls", "reference", "--world-sizes", "1",
                        "--results-dir", str(blocker / "runs"))
    assert code == 2 and "cannot write results under" in err and err.count("\n") == 1


def test_report_of_a_folder_that_is_not_a_run(capsys, tmp_path):
    code, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "is not a run folder" in err and err.count("\n") == 1


def test_report_of_a_missing_folder(capsys, tmp_path):
    code, err = run_cli(capsys, "report", str(tmp_path / "nope"))
    assert code == 2 and "is not a run folder" in err


@pytest.mark.parametrize("text, value", [("1024", 1024), ("8K", 8192), ("64M", 64 << 20), ("1G", 1 << 30),
                                         ("64MiB", 64 << 20), ("1GB", 10**9), ("4kb", 4000)])
def test_byte_sizes(text, value):
    assert parse_bytes(text) == value


def test_impls_lists_every_builtin(capsys):
    assert main(["impls"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "reference-rhd", "reference-tree", "reference-naive", "torch"):
        assert f" {name} " in out


def test_paritybench_test_maps_paradigms_to_the_installed_suites(capsys):
    from harness.cli.test import PARADIGMS, pytest_args

    assert pytest_args(["collectives", "zero", "--impl", "m:o", "-x"]) == [
        "--pyargs", "suites.collectives", "suites.zero", "--impl", "m:o", "-x"]
    assert pytest_args(["--impl", "m:o"]) == ["--pyargs", *[f"suites.{p}" for p in PARADIGMS], "--impl", "m:o"]
    assert main(["test", "collectivez", "--impl", "m:o"]) == 2
    err = capsys.readouterr().err
    assert "'collectivez' is not a paradigm suite" in err and err.count("\n") == 1


def test_a_malformed_hang_window_is_one_sentence_before_any_run_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PARITYBENCH_HANG_WINDOW_S", "ten")
    code, err = run_cli(capsys, "bench", "collectives", "--impls", "reference", "--world-sizes", "2",
                        "--results-dir", str(tmp_path / "runs"))
    assert code == 2 and err.count("\n") == 1, err
    assert "PARITYBENCH_HANG_WINDOW_S must be seconds (0 turns hang detection off), got 'ten'." in err
    assert not (tmp_path / "runs").exists()


def test_python_dash_m_harness_cli_is_the_command():
    """``python -m harness.cli`` (the CLI was one module before it became a package) still runs ``paritybench``."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "harness.cli", "schedule", "gpipe", "--p", "2", "--m", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "makespan" in out.stdout, out.stderr[-400:]


def _raises_in_a_rank(cfg, get_world, run):
    from harness.runtime.failures import RankFailure

    run.append("benchmarks.csv", {"suite": "first", "op": "before", "status": "ok"})
    raise RankFailure("rank 1: AssertionError: a third party's own assert", {1: "Traceback ...\nAssertionError"})


def _writes_a_row(cfg, get_world, run):
    run.append("benchmarks.csv", {"suite": "second", "op": "after", "status": "ok"})


def test_a_sweep_an_implementation_stops_is_named_and_the_next_sweep_runs(tmp_path, capsys):
    """``paritybench bench`` (``keep_going``): a rank's exception ends its sweep in one line, not the run — the rows
    before it and the later sweeps kept, the folder incomplete; without ``keep_going`` (calibration) it raises."""
    from types import SimpleNamespace

    from harness.cli.bench import run_plans
    from harness.records.results import RunDir, read_run
    from harness.runtime.failures import RankFailure

    plans = [("first", SimpleNamespace(), _raises_in_a_rank), ("second", SimpleNamespace(), _writes_a_row)]
    run = RunDir(tmp_path, {"suite": "all"})
    stopped = run_plans(run, plans, None, keep_going=True)
    assert stopped == ["bench first stopped (its rows so far kept): rank 1: AssertionError: a third party's own assert"]
    meta, tables = read_run(run.path)
    assert list(tables["benchmarks.csv"]["op"]) == ["before", "after"] and meta["status"] == "incomplete", meta
    assert [s["section"] for s in meta["sections"]] == ["first", "second"] and "stopped" in meta["sections"][0]
    assert "AssertionError" in capsys.readouterr().err
    from harness.cli.report import write_report

    assert f"**{stopped[0]}**" in write_report(run.path).read_text()  # the report names it too
    with pytest.raises(RankFailure):
        run_plans(RunDir(tmp_path, {"suite": "all"}), plans, None)


def test_bench_counts_its_failed_cases_last_and_the_run_is_complete(tmp_path, capsys):
    """A case an implementation raised in is a row (status failed) of a complete run, exit 0 — the suite's verdict,
    as a wrong row is; ``bench`` says how many, last on stderr, after each one's traceback."""
    import json
    from pathlib import Path

    from harness.cli.main import main

    raises = "suites.checkpoint.test_bench_smoke:RaisesAtSqrt"
    rc = main(["bench", "checkpoint", "--impls", "reference", "--impl", raises,
               "--layers", "4", "--iters", "1", "--warmup", "0", "--results-dir", str(tmp_path), "--no-report"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" in err, err
    assert err.rstrip().splitlines()[-1] == (
        'paritybench: 1 benchmark case(s) failed — an implementation raised, a rank died or a call hung (status failed '
        'in benchmarks.csv; the report\'s "Failed cases")'), err
    assert json.loads((Path(out.strip()) / "run.json").read_text())["status"] == "complete"


def test_every_bench_runs_at_the_world_sizes_asked_or_refuses_them():
    """``bench <name> --world-sizes 2``: each sweep's plans run at 2 ranks only, or the bench declares what sets its
    world size instead (``Bench.own_world_size``, refused above) — an option accepted and ignored is silently wrong
    (bench muon and bench matrix once ignored it)."""
    from harness.cli.main import _build_parser
    from harness.paradigm import benches, load

    parser, checked = _build_parser(), 0
    for name, bench in benches().items():
        if bench.own_world_size:
            continue
        for _, cfg, _ in load(bench.plans)(parser.parse_args(["bench", name, "--world-sizes", "2"])):
            assert list(cfg.world_sizes) == [2], (name, cfg.world_sizes)
            checked += 1
    assert checked >= 9, checked


def test_every_bench_runs_the_iterations_asked_under_its_own_command():
    """``bench <name> --iters 7 --warmup 0``: every sweep that times iterations runs 7 and warms up 0 (stack, 3d, muon,
    resume, context and expert parallelism once took at most 3 or 5 whatever was asked); under ``bench all`` each is
    held to at most its record's (the main job's budget), which is also its own command's default — or to its record's
    ``all_iters`` where it has one (the stack's: 2 rounds there, 3 under its own command; the zero sweep's 6 of 10)."""
    from harness.cli.main import _build_parser
    from harness.paradigm import benches, load

    parser, seen = _build_parser(), set()
    for name, bench in benches().items():
        for _, cfg, _ in load(bench.plans)(parser.parse_args(["bench", name, "--iters", "7", "--warmup", "0"])):
            if hasattr(cfg, "iters"):
                assert (cfg.iters, cfg.warmup) == (7, 0), (name, cfg.iters, cfg.warmup)
                seen.add(name)
        for _, cfg, _ in load(bench.plans)(parser.parse_args(["bench", name])):
            if hasattr(cfg, "iters"):
                assert (cfg.iters, cfg.warmup) == (bench.iters, bench.warmup), (name, cfg.iters, cfg.warmup)
    assert {"stack", "3d", "muon", "resume", "context_parallel", "expert_parallel"} <= seen, seen
    stack = benches()["stack"]
    assert stack.all_iters == 2 < stack.iters == 3
    for _, cfg, _ in load(stack.plans)(parser.parse_args(["bench", "all", "--iters", "10", "--warmup", "2"])):
        assert (cfg.iters, cfg.warmup) == (stack.all_iters, min(2, stack.warmup))
    # zero: 6 of its 10 under bench all; the pipeline its own 5 (it took bench all's 10); fewer if bench all asks fewer
    zero, pipeline = benches()["zero"], benches()["pipeline"]
    assert zero.all_iters == 6 < zero.iters and pipeline.all_iters is None
    for asked in (10, 4):
        for record in (zero, pipeline):
            args = parser.parse_args(["bench", "all", "--iters", str(asked)])
            got = [cfg.iters for _, cfg, _ in load(record.plans)(args)]
            assert got == [min(asked, record.all_iters or record.iters)], (record.name, asked, got)


def test_bench_has_the_fork_server_preload_the_stacks_its_sweeps_name(tmp_path, monkeypatch):
    """``run_plans`` names to ``harness.runtime.spawn.preload_stacks`` the third-party stacks among its sweeps'
    implementations (a name that contains one: ``torchtitan``, ``megatron``), before any World — none for sweeps of
    ours and torch's alone."""
    from types import SimpleNamespace

    from harness.cli.bench import run_plans
    from harness.records.results import RunDir
    from harness.runtime import spawn

    asked = []
    monkeypatch.setattr(spawn, "preload_stacks", lambda names: asked.append(list(names)) or [])

    def plans(*impls):
        return [(f"sweep{i}", SimpleNamespace(impls=list(names)), lambda cfg, get_world, run: None)
                for i, names in enumerate(impls)]

    run_plans(RunDir(tmp_path, {"suite": "stack"}), plans(["reference", "torchtitan"], ["megatron", "torch"]), None)
    run_plans(RunDir(tmp_path, {"suite": "stack"}), plans(["reference", "torch"]), None)
    assert asked == [["torchtitan", "megatron"], []]
