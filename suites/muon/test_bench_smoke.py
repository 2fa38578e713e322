"""``bench muon`` end to end on a small model (no timing asserted): a row per implementation, layout and world size;
the reference's bytes counted equal the cost model exactly (nothing replicated, one all-gather per matrix
otherwise), torch's flat and fused rows unsupported with their sentences, every verdict holds; the report's
section."""

from __future__ import annotations

from harness.cli.report import write_report
from harness.muon.bench import MuonSweep, run_sweep
from harness.records.results import RunDir, read_run


def test_muon_sweep_and_report(world_cache, tmp_path):
    cfg = MuonSweep(impls=["reference", "torch"], layouts=["replicated", "rows", "flat"], world_sizes=[2], hidden=16,
                    iters=2, warmup=0)
    run = RunDir(tmp_path, {"suite": "muon"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 3 * 2 + 3
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    ok, ours = rows[rows["status"] == "ok"], rows[rows["impl"] == "reference"]
    assert list(rows[rows["status"] != "ok"]["op"]) == ["flat/split"], rows[["impl", "op", "status"]]
    assert (ours["comm_bytes_measured"] == ours["comm_bytes_predicted"]).all(), ours[["op", "comm_bytes_measured"]]
    by_op = ours.set_index("op")["comm_bytes_measured"]
    assert by_op["replicated/fused"] == 0 and by_op["rows/fused"] > 0 and by_op["flat/fused"] > 0, by_op
    assert (ok["wrong"] == 0).all(), ok[["impl", "op", "wrong"]]
    torch_rows = ok[(ok["impl"] == "torch") & (ok["op"] == "rows/split")]  # DTensor's: calls, never a false 0
    assert torch_rows["comm_bytes_measured"].isna().all() and "all_gather" in torch_rows["detail"].iloc[0], torch_rows
    assert "## Muon: one optimizer step under sharding" in write_report(run.path).read_text()


def test_a_case_the_suites_verdict_fails_is_wrong_and_still_in_the_section(world_cache, tmp_path):
    """The planted local Newton-Schulz (each rank orthogonalises its own rows): its rows/split row is wrong — status
    wrong (before: ok, with wrong 1 that the gate does not read) and the first problem in ``detail`` — and still in
    the section's table; replicated it is the reference and ok."""
    cfg = MuonSweep(impls=["suites.muon.planted:LocalNewtonSchulz"], layouts=["replicated", "rows"], world_sizes=[2],
                    hidden=16, iters=1, warmup=0)
    run = RunDir(tmp_path, {"suite": "muon"})
    run_sweep(cfg, world_cache.get, run, progress=None)
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"].set_index("op")
    assert rows.loc["replicated/split", "status"] == "ok" and rows.loc["replicated/split", "wrong"] == 0
    wrong = rows.loc["rows/split"]
    assert wrong["status"] == "wrong" and wrong["wrong"] == 1 and wrong["detail"].startswith("rank "), wrong["detail"]
    report = write_report(run.path).read_text()
    section = report.split("## Muon: one optimizer step under sharding")[1].split("\n## ")[0]
    assert section.count("LocalNewtonSchulz | rows/split") == 1, section
