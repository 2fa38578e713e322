"""``bench context_parallel`` end to end at cp 2 on a tiny layer (no timing asserted): a row per
implementation and sequence plus the one-device rows; our bytes counted equal the cost model exactly;
the report's section."""

from __future__ import annotations

from harness.cli.report import write_report
from harness.context_parallel.bench import ContextParallelSweep, run_sweep
from harness.records import registry
from harness.records.results import RunDir, read_run


def test_context_parallel_sweep_and_report(world_cache, tmp_path):
    impls = [s for s in registry.names("context_parallel")
             if registry.skip_reason(registry.resolve(s, "context_parallel")) is None]
    cfg = ContextParallelSweep(impls=impls, world_sizes=[2], seqs=[8, 16], hidden=16, heads=4, kv_heads=2, iters=2,
                               warmup=0)
    run = RunDir(tmp_path, {"suite": "context_parallel"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2 + 2 * len(impls)
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["impl", "detail"]]
    ours = rows[rows["impl"].str.startswith("reference-")]
    assert len(ours) == 4 and (ours["comm_bytes_measured"] == ours["comm_bytes_predicted"]).all(), \
        ours[["impl", "op", "comm_bytes_measured", "comm_bytes_predicted"]]
    assert (rows[rows["impl"] == "one-device"]["world_size"] == 1).all()
    assert "## Context parallelism: one attention layer, forward + backward" in write_report(run.path).read_text()
