"""The collectives benchmark as pytest-benchmark tests (opt in: ``pytest -m benchmark --benchmark-only``).

Each case times ``ITERS`` calls inside the ranks (``harness.collectives.bench.bench_rank``: an exact
check first, then barrier + call per iteration) and hands the per-iteration max over ranks to
pytest-benchmark (``harness.pytest.benchmark_bridge``): its statistics are in-rank times, not the
driver's dispatch. Without ``-m benchmark`` / ``--benchmark-only`` only the smoke test runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.collectives.bench import ELEMENT_BYTES, bench_rank, case_numel
from harness.collectives.case import merge
from harness.pytest.benchmark_bridge import REPLAY_CLOCK, feed
from harness.runtime.timing import summarize

pytest.importorskip("pytest_benchmark", reason="pytest-benchmark is not installed (it comes with the test extra)")

SIZES = [1 << 10, 1 << 20, 16 << 20]
ITERS, WARMUP = 20, 3


def timed(world, impl: str, collective: str, nbytes: int) -> tuple[list[float], dict]:
    numel, s_bytes = case_numel(collective, nbytes, world.size, ELEMENT_BYTES["float32"])
    per_rank = world.run(bench_rank, impl, collective, "float32", numel, "sum", ITERS, WARMUP, timeout=300)
    verdict = merge(per_rank)
    if verdict["outcome"] == "unsupported":
        pytest.skip(f"{impl} {collective}: unsupported: {verdict['detail']}")
    assert verdict["wrong"] == 0, f"{impl} {collective} {s_bytes} B at {world.size} ranks: {verdict['detail']}"
    return summarize([r["times"] for r in per_rank])["samples_us"], {"bytes": s_bytes}


@pytest.mark.benchmark(group="collectives", timer=REPLAY_CLOCK)
@pytest.mark.parametrize("nbytes", SIZES, ids=["1KiB", "1MiB", "16MiB"])
def test_collective(benchmark, world, collectives_impl, collective_name, nbytes):
    if world.size < 2:
        pytest.skip("a collective over one rank moves nothing")
    samples, info = timed(world, collectives_impl, collective_name, nbytes)
    recorded = feed(benchmark, samples, impl=collectives_impl, op=collective_name, world_size=world.size, **info)
    assert recorded is None or recorded == pytest.approx([t * 1e-6 for t in samples], rel=1e-12)


@pytest.mark.benchmark(group="smoke", timer=REPLAY_CLOCK)
@pytest.mark.paritybench_smoke
def test_smoke_pytest_benchmark_reports_in_rank_times(benchmark, world_cache):
    """The one benchmark of the default run: pytest-benchmark's rounds are exactly the in-rank iterations
    (the replayed clock), not the driver's World round trips (which take far longer than 1 KiB on gloo)."""
    samples, _ = timed(world_cache.get(2), "torch", "all_reduce", 1 << 10)
    data = feed(benchmark, samples, impl="torch", op="all_reduce", world_size=2)
    if data is None and os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-benchmark turns itself off under pytest-xdist (tox runs two workers): this test again in a pytest
        # of its own, without xdist, where its statistics are taken and checked (~5 s)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}  # read as a worker else
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                              f"{__file__}::{test_smoke_pytest_benchmark_reports_in_rank_times.__name__}"],
                             capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
                             env=env)
        assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
        assert "benchmark 'smoke': 1 tests" in out.stdout, out.stdout[-3000:]  # its statistics were taken
        return
    if data is None:  # --benchmark-disable: the target ran once, no statistics (the user asked for none)
        return
    assert len(data) == ITERS
    assert data == pytest.approx([t * 1e-6 for t in samples], rel=1e-12)
    assert benchmark.stats.stats.min == pytest.approx(min(samples) * 1e-6, rel=1e-12)
