"""``bench low_precision`` end to end on a tiny layer (no timing asserted): a row per implementation, recipe and layout;
ours runs every row but the float8 all-gather with rowwise scales (unsupported, with its sentence), its bytes counted
equal the cost model exactly, the float8 all-gather's a quarter of float32's plus the amax; every verdict holds; the
report's section."""

from __future__ import annotations

from harness.cli.report import write_report
from harness.low_precision.bench import LAYOUTS, LowPrecisionSweep, run_sweep
from harness.records.results import RunDir, read_run


def test_low_precision_sweep_and_report(world_cache, tmp_path):
    cfg = LowPrecisionSweep(impls=["reference"], recipes=["float8-tensorwise", "float8-rowwise"], dims=(64, 64, 64),
                            iters=2, warmup=0)
    run = RunDir(tmp_path, {"suite": "low_precision"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2 * len(LAYOUTS)
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    ok = rows[rows["status"] == "ok"]
    assert list(rows[rows["status"] != "ok"]["op"]) == ["float8-rowwise/fsdp-fp8ag"], rows[["op", "status"]]
    assert (ok["comm_bytes_measured"] == ok["comm_bytes_predicted"]).all(), ok[["op", "comm_bytes_measured"]]
    assert (ok["wrong"] == 0).all(), ok[["op", "wrong"]]
    by_op = ok.set_index("op")["comm_bytes_measured"]
    forward_hp = by_op["float8-tensorwise/fsdp"] - 64 * 64 * 4 / 2  # less the gradient's reduce-scatter
    assert by_op["float8-tensorwise/fsdp-fp8ag"] - 64 * 64 * 4 / 2 == forward_hp / 4 + 4, by_op
    assert "## Low precision: one linear layer under float8 / MXFP8" in write_report(run.path).read_text()
