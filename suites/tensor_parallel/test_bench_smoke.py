"""The tensor-parallel benchmark runs end to end on tiny layers; counted bytes equal the cost model's
exactly where they are counted. No timings asserted."""

from __future__ import annotations

import math

import pytest

from harness.cli.report import write_report
from harness.records import registry
from harness.records.results import RunDir, read_run
from harness.tensor_parallel.bench import TensorParallelSweep, run_sweep


def test_tensor_parallel_sweep_bytes_and_report(world_cache, world_sizes, tmp_path):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    impls = [s for s in registry.names("tensor_parallel")
             if registry.skip_reason(registry.resolve(s, "tensor_parallel")) is None]
    cfg = TensorParallelSweep(impls=impls, world_sizes=[2], seq=4, batch=2, hidden=8, ffn=16, iters=2, warmup=1,
                              vocab=64, heads=4)
    run = RunDir(tmp_path, {"suite": "tensor_parallel"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == len(impls) * 6
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert (rows["status"] == "ok").all() and (rows["time_p50_us"] > 0).all()
    for _, r in rows.iterrows():
        if r["impl"] == "torch":
            assert math.isnan(r["comm_bytes_measured"])  # functional collectives: not counted, not zero
        else:  # 4 * 2 * 8 float32 activations, 256 B per all-reduce over 2 ranks; the LM head adds its
            # cross-entropy's three all-reduces of 4 * 2 float32 scalars (32 B each)
            want = {"column": 256, "row": 256, "embedding": 256, "mlp": 512, "attention": 512, "lm_head": 352}
            assert r["comm_bytes_measured"] == r["comm_bytes_predicted"] == want[r["op"]], r["op"]
    assert "## Tensor parallel: forward + backward per layer" in write_report(run.path).read_text()
