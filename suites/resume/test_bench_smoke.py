"""``bench resume`` end to end on a tiny GPT over 2 ranks (no timing asserted): a save and a load row per
layout, the busiest rank's bytes against the cost model, the report's section."""

from __future__ import annotations

from harness.cli.report import write_report
from harness.records.results import RunDir, read_run
from harness.resume.bench import ResumeSweep, run_sweep


def test_resume_sweep_rows_and_report(world_cache, tmp_path):
    cfg = ResumeSweep(world_sizes=[2], vocab=13, hidden=16, heads=8, ffn=32, layers=2, iters=1, warmup=0)
    run = RunDir(tmp_path, {"suite": "resume"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2 * 3
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert sorted(rows["op"]) == sorted(f"{w} {lay}" for w in ("load", "save") for lay in ("1x1x2", "1x2x1", "2x1x1"))
    assert (rows["status"] == "ok").all() and (rows["time_p50_us"] > 0).all()
    # float32 weights + momentum: 8 bytes per parameter in all; the busiest rank writes its half, plus what
    # is replicated (LayerNorms under TP) or unevenly split (13 vocabulary rows over 2)
    numel = int(rows["count"].iloc[0])
    assert (rows["bytes"] >= 8 * numel).all() and (rows["bytes"] <= 8 * numel * 1.2).all()
    assert (rows["state_bytes_rank_max"] >= rows["state_bytes_predicted"]).all()
    assert (rows["state_bytes_rank_max"] <= 1.2 * rows["state_bytes_predicted"]).all()
    assert not any(p.name.startswith("resume-") for p in run.path.iterdir())  # the checkpoints are cleaned up
    assert "## Resume: save and load" in write_report(run.path).read_text()


def test_a_layout_the_stack_raises_at_is_a_failed_save_and_load_and_the_sweep_goes_on(world_cache, tmp_path):
    """``suites.stack.raises:RaisesAtPipeline`` raises at its save on rank 1 at pp 2: that layout's two rows are
    failed, naming rank 1's exception, without timings; the next layout runs (on a respawned World) and is ok."""
    cfg = ResumeSweep(world_sizes=[2], layouts=[(1, 2, 1), (2, 1, 1)], vocab=13, hidden=16, heads=8, ffn=32,
                      layers=2, iters=1, warmup=0, impl="suites.stack.raises:RaisesAtPipeline")
    run = RunDir(tmp_path, {"suite": "resume"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 4
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert dict(zip(rows["op"], rows["status"], strict=True)) == {"save 1x2x1": "failed", "load 1x2x1": "failed",
                                                     "save 2x1x1": "ok", "load 2x1x1": "ok"}
    failed = rows[rows["status"] == "failed"]
    assert failed["detail"].str.startswith("rank 1: OSError: checkpoint volume is read-only").all(), failed["detail"]
    assert failed["time_p50_us"].isna().all() and not any(p.name.startswith("resume-") for p in run.path.iterdir())


def test_a_stack_that_does_not_provide_the_case_or_save_is_unsupported(world_cache, tmp_path):
    """A stack refusing the layout at build (``docs.examples.ddp_stack``: dp only) and one without ``save`` / ``load``
    (the same example at dp 2, ZeRO 0: the stack contract leaves them optional) get unsupported rows with the
    sentence, not failed ones."""
    spec = "docs.examples.ddp_stack:DDPStack"
    run = RunDir(tmp_path, {"suite": "resume"})
    for zero, dims in ((0, (1, 2, 1)), (0, (2, 1, 1))):
        cfg = ResumeSweep(world_sizes=[2], layouts=[dims], zero_stage=zero, vocab=13, hidden=16, heads=8, ffn=32,
                          layers=2, iters=1, warmup=0, impl=spec)
        assert run_sweep(cfg, world_cache.get, run, progress=None) == 2
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert (rows["status"] == "unsupported").all(), rows[["op", "status", "detail"]]
    detail = dict(zip(rows["op"], rows["detail"], strict=True))
    assert detail["save 1x2x1"].startswith("the DDP example trains data parallel only")
    assert detail["save 2x1x1"] == f"{spec} provides no save / load (optional in the stack contract)."


def test_bench_resume_times_the_stacks_asked_one_sweep_each():
    """``bench resume`` times the reference stack's save and load; ``--impls`` / ``--impl`` each stack named (it
    ignored them once)."""
    from harness.cli.main import _build_parser
    from harness.resume.cli import plans

    parser = _build_parser()
    assert [cfg.impl for _, cfg, _ in plans(parser.parse_args(["bench", "resume"]))] == ["reference"]
    chosen = plans(parser.parse_args(["bench", "resume", "--impls", "torch,reference", "--impl",
                                      "docs.examples.ddp_stack:DDPStack"]))
    assert [cfg.impl for _, cfg, _ in chosen] == ["torch", "reference", "docs.examples.ddp_stack:DDPStack"]
