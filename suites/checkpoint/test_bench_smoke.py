"""The checkpointing benchmark runs end to end on a small stack; the measured peak activation memory
(saved tensors, not timings) falls with checkpointing and stays within cost_model's sqrt(L) bound."""

from __future__ import annotations

from harness.checkpoint.bench import CheckpointSweep, run_sweep
from harness.cli.report import write_report
from harness.records.results import RunDir, read_run
from reference.checkpoint import ReferenceCheckpointing


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


class RaisesAtSqrt(ReferenceCheckpointing):
    """Raises a plain error (not ``Unsupported``) for the sqrt policy."""

    def wrap(self, layers, policy):
        if policy == "sqrt":
            raise RuntimeError("no segment boundary for 9 layers")
        return super().wrap(layers, policy)


def test_a_policy_an_implementation_raises_at_is_a_failed_row_and_the_sweep_goes_on(tmp_path, capsys):
    """Before: the exception ended ``bench`` (this sweep runs in the driver: no World to catch it)."""
    cfg = CheckpointSweep(impls=["suites.checkpoint.test_bench_smoke:RaisesAtSqrt", "reference"], layers=[9],
                          hidden=16, batch=4, iters=1, warmup=0)
    run = RunDir(tmp_path, {"suite": "checkpoint"})
    assert run_sweep(cfg, None, run, progress=None) == 1 + 1 + 2
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    status = dict(zip(rows["impl"].str.split(":").str[-1] + " " + rows["op"], rows["status"], strict=True))
    assert status == {"none none": "ok", "RaisesAtSqrt layer": "ok", "RaisesAtSqrt sqrt": "failed",
                      "reference layer": "ok", "reference sqrt": "ok"}
    assert rows[rows["status"] == "failed"]["detail"].tolist() == [
        "raised RuntimeError: no segment boundary for 9 layers"]
    assert "Traceback" in capsys.readouterr().err
