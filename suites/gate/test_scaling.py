"""The scaling section and scaling.csv, from a synthetic run folder: throughput, ideal and efficiency per
suite's rule (busbw flat; weak scaling: work per rank x n; strong: one global batch)."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.cli.report import write_report

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


def test_scaling_plot_is_small_multiples_with_report_wide_colours():
    """One panel per suite and operation, one line (plus its dashed ideal) per implementation in the colour
    every plot of the report gives it, and the legend outside the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.records.results import BENCHMARK_KEY
    from harness.records.scaling import impl_colors, scaling_figure, scaling_table

    rows = [{**bench_row(n=n, busbw_gbps=b, time_p50_us=100.0 * n), "op": op, "impl": impl}
            for op in ("all_reduce", "all_gather", "broadcast") for impl in ("reference", "torch", "my.pkg:Impl")
            for n, b in ((2, 1.0), (4, 0.9))]
    rows += [{**bench_row(n=n, nbytes=None), "suite": "zero", "op": f"stage{s}", "zero_stage": s, "count": 128,
              "reduce_op": None, "time_p50_us": 1000.0 * n, "impl": "reference"} for s in (1, 2) for n in (2, 4)]
    bench = pd.DataFrame(rows)
    for col in BENCHMARK_KEY:  # as read_run gives them: every key column, blank where it does not apply
        bench[col] = bench.get(col)
    table = scaling_table(bench)
    fig = scaling_figure(table)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in panels) == sorted(
        ["collectives: all_gather", "collectives: all_reduce", "collectives: broadcast", "zero: stage1",
         "zero: stage2"])
    colors = impl_colors(table["impl"])
    assert colors == impl_colors(["torch", "my.pkg:Impl", "reference", "reference"])  # order-independent
    assert len(set(colors.values())) == 3
    for ax in panels:
        assert ax.get_legend() is None  # never over the data
        want = 3 if ax.get_title().startswith("collectives") else 1
        assert len(ax.lines) == 2 * want  # each implementation's line and its ideal
        assert {matplotlib.colors.to_hex(line.get_color()) for line in ax.lines} <= set(colors.values())
    assert fig.legends and {t.get_text() for t in fig.legends[0].get_texts()} >= set(colors)
    plt.close(fig)
