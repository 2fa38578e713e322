"""The pipeline benchmark as pytest-benchmark tests (opt in: ``pytest -m benchmark --benchmark-only``).

A training step of each schedule at p = 2, timed inside the ranks (``harness.pipeline.bench.bench_rank``)
and handed to pytest-benchmark as in-rank times (``harness.pytest.benchmark_bridge``).
"""

from __future__ import annotations

import pytest

from harness.pipeline.bench import bench_rank
from harness.pytest.benchmark_bridge import REPLAY_CLOCK, feed
from harness.runtime.timing import summarize

pytest.importorskip("pytest_benchmark", reason="pytest-benchmark is not installed (it comes with the test extra)")

HIDDEN, LAYERS_PER_STAGE, ROWS, ITERS, WARMUP = 128, 2, 32, 10, 2


@pytest.mark.benchmark(group="pipeline", timer=REPLAY_CLOCK)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1"])
@pytest.mark.parametrize("m", [2, 8])
def test_pipeline_step(benchmark, world_cache, pipeline_impl, schedule, m):
    p, v = 2, 2 if schedule == "interleaved" else 1
    per_rank = world_cache.get(p).run(bench_rank, pipeline_impl, schedule, p, m, v, HIDDEN, LAYERS_PER_STAGE, ROWS,
                                      ITERS, WARMUP, timeout=300)
    unsupported = [r["unsupported"] for r in per_rank if "unsupported" in r]
    if unsupported:
        pytest.skip(f"{pipeline_impl} {schedule}: unsupported: {unsupported[0]}")
    samples = summarize([r["times"] for r in per_rank])["samples_us"]
    recorded = feed(benchmark, samples, impl=pipeline_impl, schedule=schedule, p=p, m=m)
    assert recorded is None or recorded == pytest.approx([t * 1e-6 for t in samples], rel=1e-12)
