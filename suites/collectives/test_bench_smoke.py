"""The benchmark and report code run end to end on tiny sizes (so they cannot rot). No timings asserted."""

from __future__ import annotations

import pytest

from harness.cli.report import write_report
from harness.collectives.bench import SweepConfig, busbw_factor, case_numel, run_sweep, sweep_sizes
from harness.records.results import RunDir, read_run


def test_sizes_and_factors_follow_nccl_tests():
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(1024, 5000, 4) == [1024, 4096]
    assert busbw_factor("all_reduce", 4) == 1.5 and busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("broadcast", 4) == 1.0 and busbw_factor("all_to_all", 2) == 0.5
    assert case_numel("all_reduce", 1000, 4, 4) == (250, 1000)
    assert case_numel("all_gather", 1000, 3, 4) == (83, 996)  # whole blocks: S is what actually moved


@pytest.fixture(scope="module")
def tiny_run(world_cache, world_sizes, tmp_path_factory):
    sizes = [n for n in world_sizes if n > 1][:2] or [1]
    cfg = SweepConfig(impls=["reference", "reference-rhd", "torch"], world_sizes=sizes, min_bytes=64,
                      max_bytes=4096, factor=8, iters=3, warmup=1, dispatch_iters=20)
    run = RunDir(tmp_path_factory.mktemp("runs"), {"suite": "collectives"})
    rows = run_sweep(cfg, world_cache.get, run, progress=None)
    run.finish()
    return run.path, cfg, rows


def test_sweep_rows_are_complete_and_correct(tiny_run):
    path, cfg, rows = tiny_run
    meta, frames = read_run(path)
    bench = frames["benchmarks.csv"]
    sweep = bench[bench["suite"] == "collectives"]
    # reference and torch: all 6 collectives; reference-rhd only where it differs (all_reduce).
    assert rows == len(sweep) == len(cfg.world_sizes) * 3 * (6 + 6 + 1)
    ok = sweep[sweep["status"] == "ok"]
    assert (ok["wrong"] == 0).all() and (ok["busbw_gbps"] >= 0).all() and (ok["time_p50_us"] > 0).all()
    assert (ok["time_min_us"] <= ok["time_p50_us"]).all() and (ok["time_p50_us"] <= ok["time_max_us"]).all()
    assert set(sweep["status"]) <= {"ok", "unsupported"}
    dispatch = bench[bench["suite"] == "world"]
    assert sorted(dispatch["world_size"]) == sorted(cfg.world_sizes)
    assert len(frames["conformance.csv"]) == rows and set(frames["conformance.csv"]["outcome"]) == {"pass"}


def test_report_has_tables_and_plots(tiny_run):
    path, _, _ = tiny_run
    report = write_report(path).read_text()
    assert "## all_reduce: busbw (GB/s) by size" in report
    assert "## Reference vs native (busbw ratio)" in report
    assert "World dispatch overhead" in report
    for op in ("all_reduce", "all_gather", "broadcast"):
        png = path / f"busbw_{op}.png"
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _swept(world_cache, tmp_path, impls: list[str], op: str, **kw):
    cfg = SweepConfig(impls=[f"suites.collectives.impls:{i}" if i[0].isupper() else i for i in impls],
                      world_sizes=[2], ops=[op], min_bytes=64, max_bytes=64, iters=2, warmup=1, dispatch_iters=1, **kw)
    run = RunDir(tmp_path, {"suite": "collectives"})
    run_sweep(cfg, world_cache.get, run, progress=None)
    run.finish()
    _, frames = read_run(run.path)
    bench = frames["benchmarks.csv"]
    by_impl = lambda frame: {r["impl"].split(":")[-1]: r for r in frame.to_dict("records")}  # noqa: E731
    return by_impl(bench[bench["suite"] == "collectives"]), by_impl(frames["conformance.csv"])


def test_a_check_that_raises_is_failed_and_the_sweep_goes_on(world_cache, world_sizes, tmp_path):
    """RaisesOnRankOne raises in the exact check on rank 1 (rank 0 then waits for it in the timing): its case is
    failed, untimed, its conformance row a fail naming rank 1's exception; the reference after it is ok."""
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    bench, conf = _swept(world_cache, tmp_path, ["RaisesOnRankOne", "reference"], "all_gather")
    raised = bench["RaisesOnRankOne"]
    assert raised["status"] == "failed" and raised["detail"].startswith("rank 1: raised RuntimeError: out of buffers")
    assert raised["time_p50_us"] != raised["time_p50_us"]  # NaN: no timing
    assert conf["RaisesOnRankOne"]["outcome"] == "fail" and conf["RaisesOnRankOne"]["detail"] == raised["detail"]
    assert bench["reference"]["status"] == "ok" and conf["reference"]["outcome"] == "pass"


def test_a_check_that_fails_is_wrong_timed_only_where_the_call_returned_wrong_elements(world_cache, world_sizes,
                                                                                       tmp_path):
    """ForgetsAverage returns wrong elements: wrong, with their count, and timed (the call runs); AcceptsIntegerAvg
    accepts AVG on int32, which the contract leaves out: wrong with no wrong element — before, status ok and timed."""
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    bench, conf = _swept(world_cache, tmp_path / "float", ["ForgetsAverage"], "all_reduce", reduce_op="avg")
    row = bench["ForgetsAverage"]
    assert row["status"] == "wrong" and row["wrong"] > 0 and row["time_p50_us"] > 0
    assert conf["ForgetsAverage"]["outcome"] == "fail"
    bench, conf = _swept(world_cache, tmp_path / "int", ["AcceptsIntegerAvg"], "all_reduce", reduce_op="avg",
                         dtype="int32")
    row = bench["AcceptsIntegerAvg"]
    assert row["status"] == "wrong" and row["wrong"] == 0 and "accepted AVG on int32" in row["detail"]
    assert row["time_p50_us"] != row["time_p50_us"]  # NaN
    assert conf["AcceptsIntegerAvg"]["outcome"] == "fail"
