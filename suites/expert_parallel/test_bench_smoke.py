"""``bench expert_parallel`` end to end at ep 2 on a tiny layer (no timing asserted): a row per implementation,
token count and skew plus the one-device rows; our bytes counted equal the exact model of the routing it saw;
the skewed router really sends every assignment to EP rank 0 and doubles no one's bytes beyond that model; the
report's section."""

from __future__ import annotations

from harness.cli.report import write_report
from harness.expert_parallel.bench import ExpertParallelSweep, installed_third_parties, run_sweep
from harness.records import registry
from harness.records.results import RunDir, read_run


def test_expert_parallel_sweep_and_report(world_cache, tmp_path):
    impls = [s for s in registry.names("expert_parallel")
             if registry.skip_reason(registry.resolve(s, "expert_parallel")) is None] + installed_third_parties()
    cfg = ExpertParallelSweep(impls=impls, world_sizes=[2], tokens=[8], hidden=16, ffn=16, experts=4, iters=2,
                              warmup=0)
    run = RunDir(tmp_path, {"suite": "expert_parallel"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 2 + 2 * len(impls)
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["impl", "detail"]]
    ours = rows[rows["impl"] == "reference"]
    assert len(ours) == 2 and (ours["comm_bytes_measured"] == ours["comm_bytes_routed"]).all(), \
        ours[["op", "comm_bytes_measured", "comm_bytes_routed"]]
    skewed = ours[ours["op"].str.endswith("-skew")].iloc[0]
    assert skewed["received_max"] == 2 * 8 * 2  # both ranks' 8 tokens x top-2, all at EP rank 0
    assert (ours["dispatch_p50_us"] > 0).all()
    assert (rows[rows["impl"] == "one-device"]["world_size"] == 1).all()
    third = rows[rows["impl"].isin(installed_third_parties())]
    assert (third["comm_bytes_measured"] > 0).all(), third[["impl", "op", "comm_bytes_measured"]]
    assert "## Expert parallelism: one MoE layer, forward + backward" in write_report(run.path).read_text()


def test_the_sweep_takes_the_installed_third_parties_and_refuses_a_missing_one(monkeypatch):
    import argparse

    import pytest

    from harness.errors import UsageError
    from harness.expert_parallel import bench
    from harness.expert_parallel.cli import ep_impls

    monkeypatch.setattr(bench, "installed_third_parties", lambda: ["torchtitan-moe"])

    def impls(named=None):
        return ep_impls(argparse.Namespace(impls=named, impl=[]))
    assert impls() == ["reference", "torchtitan-moe"]  # none named: ours and what is installed
    assert impls("torchtitan-moe") == ["torchtitan-moe"]
    assert impls("reference,torchtitan-moe") == ["reference", "torchtitan-moe"]
    with pytest.raises(UsageError, match="^megatron-moe needs megatron.core, which is not installed.$"):
        impls("megatron-moe")
