"""The checkpointing benchmark runs end to end on a small stack; the measured peak activation memory
(saved tensors, not timings) falls with checkpointing and stays within cost_model's sqrt(L) bound."""

from __future__ import annotations

from harness.checkpoint.bench import CheckpointSweep, run_sweep
from harness.cli.report import write_report
from harness.records.results import RunDir, read_run


def test_checkpoint_sweep_memory_and_report(tmp_path):
    cfg = CheckpointSweep(impls=["reference", "torch"], layers=[9], hidden=16, batch=4, iters=1, warmup=0)
    run = RunDir(tmp_path, {"suite": "checkpoint"})
    assert run_sweep(cfg, None, run, progress=None) == 1 + 2 * 2
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"].set_index(["impl", "op"])
    none = rows.loc[("none", "none"), "act_peak_bytes"]
    for impl in ("reference", "torch"):
        for policy in ("layer", "sqrt"):
            assert rows.loc[(impl, policy), "act_peak_bytes"] < none, (impl, policy)
        assert rows.loc[(impl, "sqrt"), "act_peak_bytes"] <= rows.loc[(impl, "sqrt"), "act_peak_predicted"]
    assert "## Activation checkpointing" in write_report(run.path).read_text()
