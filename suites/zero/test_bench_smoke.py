"""The ZeRO benchmark runs end to end on a small block, with its variants (the reference in bf16 mixed
precision, every implementation clipping, hybrid sharding over the (2, 1) mesh); for the reference, measured memory
and counted bytes equal the cost model's exactly (its padding is zero here: every flat buffer's size is even at
N = 2) — in mixed precision the ZeRO paper's 2 + 2 + 12 bytes per parameter, hybrid the replicas' all-reduce of
whole gradients apart (``hsdp_step_comm_bytes``). No timings asserted."""

from __future__ import annotations

import math

import pytest

from harness.cli.report import write_report
from harness.records.results import RunDir, read_run
from harness.zero.bench import ZeroSweep, run_sweep


def test_zero_sweep_memory_bytes_and_report(world_cache, world_sizes, tmp_path):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    cfg = ZeroSweep(impls=["reference", "reference-naive", "torch"], world_sizes=[2], hidden=64, seq=4, batch=2,
                    iters=2, warmup=1)
    run = RunDir(tmp_path, {"suite": "zero"})
    # plain: 4 + 1 (the naive variant: stage 0 only) + 4; bf16: the reference's 4; clip: 4 + 1 + 4; hybrid: stages
    # 1-3 of the reference and of torch (its stage 1: unsupported, one sentence)
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 9 + 4 + 9 + 6
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert list(rows[rows["status"] != "ok"]["op"] + "/" + rows[rows["status"] != "ok"]["impl"]) == \
        ["stage1+hybrid2x1/torch"]
    rows = rows[rows["status"] == "ok"]
    hybrid = rows["op"].str.contains("+hybrid", regex=False)
    assert (rows["time_p50_us"] > 0).all()
    for _, r in rows[hybrid & (rows["impl"] == "reference")].iterrows():  # (2, 1): the replicas move everything
        assert r["comm_bytes_replicate"] == r["comm_bytes_replicate_predicted"] == r["comm_bytes_measured"] > 0, r
    assert sorted(rows[rows["dtype"] == "bfloat16"]["op"]) == ["stage0", "stage1", "stage2", "stage3"]
    assert (rows["op"].str.endswith("+clip")).sum() == 9
    for _, r in rows[~rows["op"].str.endswith("+clip")].iterrows():  # clip rows add the norm's all-reduce
        if r["impl"].startswith("reference"):
            assert r["comm_bytes_measured"] == r["comm_bytes_predicted"], r
            for kind in ("params", "grads", "optimizer"):
                assert r[f"mem_{kind}_bytes"] == r[f"mem_{kind}_predicted"], (r["op"], kind)
        elif r["zero_stage"] == 0:
            assert math.isnan(r["comm_bytes_measured"])  # DDP's C++ reducer: not counted, not zero
    text = write_report(run.path).read_text()
    assert "## Data parallel / ZeRO: memory per rank" in text and (run.path / "zero_memory.png").exists()
    assert "### Mixed precision: the ZeRO paper's setting, measured" in text
    assert "### Global-norm clipping: step time" in text
    assert "### Hybrid sharding (HSDP): the two reductions" in text


def test_bad_zero_variants_are_one_sentence(capsys):
    from harness.cli.main import main

    assert main(["bench", "zero", "--zero-variants", "plain,fp8"]) == 2
    assert "--zero-variants 'plain,fp8' must be comma-separated among plain, bf16, clip, hybrid." in \
        capsys.readouterr().err


def test_a_case_an_implementation_raises_in_is_a_failed_row_and_the_sweep_goes_on(world_cache, world_sizes, tmp_path):
    """A trainer whose step raises on its last rank (its peer blocked in the gradient reduction) gives its case a
    failed row with rank 1's exception and no timing; the next case runs on a respawned World and is ok."""
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    cfg = ZeroSweep(impls=["suites.zero.planted:LastRankStepRaises", "reference"], world_sizes=[2], stages=[0],
                    hidden=64, seq=4, batch=2, iters=1, warmup=2, variants=["plain"])
    run = RunDir(tmp_path, {"suite": "zero"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert list(rows["status"]) == ["failed", "ok"] and list(rows["impl"].str.split(":").str[-1]) == \
        ["LastRankStepRaises", "reference"]
    assert rows["detail"].iloc[0].startswith("rank 1: ValueError: bucket size not divisible on the last rank")
    assert math.isnan(rows["time_p50_us"].iloc[0]) and rows["time_p50_us"].iloc[1] > 0
