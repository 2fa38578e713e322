"""The scaling section and scaling.csv, from a synthetic run folder: throughput, ideal and efficiency per
suite's rule (busbw flat; weak scaling: work per rank x n; strong: one global batch)."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.report import write_report

from .runs import bench_row, write_run


def test_scaling_csv_and_section(tmp_path):
    rows = [
        bench_row(n=2, busbw_gbps=1.0, time_p50_us=100.0), bench_row(n=4, busbw_gbps=0.8, time_p50_us=150.0),
        {**bench_row(n=2, nbytes=None), "suite": "zero", "op": "stage1", "zero_stage": 1, "count": 128,
         "reduce_op": None, "time_p50_us": 1000.0},
        {**bench_row(n=4, nbytes=None), "suite": "zero", "op": "stage1", "zero_stage": 1, "count": 128,
         "reduce_op": None, "time_p50_us": 1250.0},
        {**bench_row(n=2, nbytes=None), "suite": "tensor_parallel", "op": "mlp", "count": 1024, "reduce_op": None,
         "time_p50_us": 1000.0},
        {**bench_row(n=4, nbytes=None), "suite": "tensor_parallel", "op": "mlp", "count": 1024, "reduce_op": None,
         "time_p50_us": 600.0},
        {**bench_row(n=2, nbytes=None), "suite": "3d", "op": "2x1x1", "time_p50_us": 5.0},  # one size: no row
    ]
    run = write_run(tmp_path, rows)
    report = write_report(run).read_text()
    table = pd.read_csv(f"{run}/scaling.csv")
    eff = {(r.suite, r.world_size): r.efficiency for r in table.itertuples()}
    assert eff[("collectives", 2)] == 1.0 and eff[("collectives", 4)] == pytest.approx(0.8)
    # weak: 128 tokens per rank; n=2: 256 tokens / 1 ms; n=4: 512 / 1.25 ms against the ideal 2 x 256 / 1 ms
    assert eff[("zero", 4)] == pytest.approx((512 / 1.25e-3) / (2 * 256 / 1e-3))
    # strong: one batch of 1024; n=4 in 0.6 ms against the ideal 1 ms / 2
    assert eff[("tensor_parallel", 4)] == pytest.approx((1024 / 0.6e-3) / (2 * 1024 / 1e-3))
    assert set(table["suite"]) == {"collectives", "zero", "tensor_parallel"}
    assert set(table["scaling"]) == {"busbw", "weak", "strong"}
    assert "## Scaling" in report and "![scaling](scaling.png)" in report
