"""``bench stack`` end to end on a tiny model over 2 ranks, both stacks, both families (no timing asserted):
every case a row; the bytes counted equal the planner's terms plus the loss's all-reduce exactly where the
plan holds every byte — dp 2: ZeRO 2's reduce-scatter and all-gather of Psi / 2 each (FSDP2's per-parameter
padding added); pp 2: each microbatch's activations one way — for ours (Python collectives, batched sends)
and torch's (FSDP2's all_gather_single / reduce_scatter_single, pipelining's sends); torch's tp 2 is counted
through DTensor's functional collectives (more than the plan's four activation all-reduces per layer: the
embedding and the vocabulary-parallel loss add theirs); the report's section and the planner's per stack."""

from __future__ import annotations

import pytest

from harness.cli.report import write_report
from harness.records.results import RunDir, read_run
from harness.stack.bench import StackSweep, predicted_bytes, run_sweep, spec_of

from ..planner.synthetic import profile

LOSS_ALL_REDUCE = 8.0
"""The step's loss: one float64 all-reduced over the 2 ranks (a ring: 2 (n - 1) / n x 8 bytes)."""


def fsdp_padding(spec, dp: int) -> float:
    """FSDP2 pads each parameter's first dimension to a multiple of dp, and its all-gather and reduce-scatter
    move the padding too (here the 13-row embedding and head: one row each)."""
    pad = sum((-p.shape[0] % dp) * (p.numel() // p.shape[0]) for p in spec.build(0).parameters())
    return 2 * (dp - 1) / dp * pad * 4


@pytest.fixture(scope="module")
def swept(world_cache, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack-bench")
    cfg = StackSweep(world_size=2, vocab=13, hidden=16, heads=8, kv_heads=2, ffn=32, layers=2, seq=4, rows=1, iters=2,
                     warmup=0, profile=str(profile(2, overhead=1e-3).save(tmp / "profile.json")))
    run = RunDir(tmp, {"suite": "stack"})
    n = run_sweep(cfg, world_cache.get, run, progress=None)
    run.finish()
    return cfg, n, run.path, read_run(run.path)[1]["benchmarks.csv"]


def test_every_case_is_a_row(swept):
    cfg, n, _, rows = swept
    assert n == 12 and len(rows) == 12  # 2 stacks x 2 families x 3 layouts
    assert set(rows["op"]) == {f"{f}/{d}" for f in ("gpt", "llama") for d in ("1x1x2", "1x2x1", "2x1x1")}
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["impl", "op", "detail"]]
    dp = rows["op"].str.split("/").str[1].str.split("x").str[0].astype(int)
    tokens = dp * rows["microbatches"] * cfg.rows * cfg.seq  # the global batch
    assert ((rows["tokens_per_s"] - tokens / (rows["time_p50_us"] / 1e6)).abs() <= 1e-9 * rows["tokens_per_s"]).all()


@pytest.mark.parametrize("layout", ["2x1x1", "1x2x1"])
def test_bytes_counted_are_the_plan_plus_the_loss(swept, layout):
    cfg, _, _, rows = swept
    for _, r in rows[rows["op"].str.endswith(layout)].iterrows():
        dp, pp, tp = map(int, layout.split("x"))
        want = predicted_bytes(cfg, int(r["count"]), dp, pp, tp, int(r["microbatches"])) + LOSS_ALL_REDUCE
        if r["impl"] == "torch":
            want += fsdp_padding(spec_of(cfg, r["op"].split("/")[0]), dp)
        assert r["comm_bytes_measured"] == want, (r["impl"], r["op"], r["comm_bytes_measured"], want)


def test_functional_collectives_are_counted(swept):
    cfg, _, _, rows = swept
    torch_tp = rows[(rows["impl"] == "torch") & rows["op"].str.endswith("1x1x2")]
    for _, r in torch_tp.iterrows():
        plan = predicted_bytes(cfg, int(r["count"]), 1, 1, 2, int(r["microbatches"]))
        assert r["comm_bytes_measured"] > plan + LOSS_ALL_REDUCE, (r["op"], r["comm_bytes_measured"], plan)


def test_report_has_the_stack_section_and_the_planner_per_stack(swept):
    _, _, path, rows = swept
    assert (rows["time_planned_us"] > 0).all()
    report = write_report(path).read_text()
    assert "## Stacks: every layout, through the stack contract" in report and "### Beside ours" in report
    for title in ("Stack reference, gpt", "Stack torch, llama"):
        assert f"### {title} (dp x pp x tp)" in report


def test_a_case_a_stack_does_not_provide_is_an_unsupported_row(world_cache, tmp_path):
    cfg = StackSweep(impls=["torch"], families=["llama"], world_size=2, vocab=13, hidden=16, heads=8, kv_heads=1,
                     ffn=32, layers=2, seq=4, rows=1, iters=1, warmup=0, layouts=[(1, 1, 2)])
    run = RunDir(tmp_path, {"suite": "stack"})
    run_sweep(cfg, world_cache.get, run, progress=None)
    run.finish()
    row = read_run(run.path)[1]["benchmarks.csv"].iloc[0]
    assert row["status"] == "unsupported" and "KV heads" in row["detail"], row["detail"]


def test_the_main_job_measures_the_third_parties_beside_ours_at_their_zero_stage():
    """bench all's Adam sweeps: one per ZeRO stage the installed third parties shard with, ours in each (the
    side-by-side compares like with like), one row per micro-batch (torchtitan's pipeline takes that), rows
    labelled with the recipe so the gate never compares them with the SGD sweep's."""
    from harness.stack.bench import family_label, third_party_sweeps

    base = StackSweep(impls=["reference", "torch", "megatron", "deepspeed", "torchtitan"])
    sweeps = third_party_sweeps(base, base.impls)
    assert [(s.zero_stage, s.impls) for s in sweeps] == [(1, ["reference", "megatron", "deepspeed"]),
                                                          (2, ["reference", "torchtitan"])]
    assert all(s.optimizer == "adam" and s.rows == 1 and s.families == ["llama"] and s.layouts for s in sweeps)
    assert family_label(sweeps[0], "llama") == "llama-adam-zero1" and family_label(base, "llama") == "llama"
    assert third_party_sweeps(base, ["reference", "torch"]) == []  # none installed: no sweep


def test_the_main_job_sweeps_the_llama_and_bench_stack_both_families():
    """bench all's stack sweep trains the Llama alone (its ten layouts for ours and torch's would double with
    the GPT: ~100 s of a main job that must fit its 10 minutes on 2 cores); bench stack keeps both, and
    --families chooses under either."""
    from harness.cli.main import _build_parser
    from harness.stack.cli import config

    def families(*argv):
        return config(_build_parser().parse_args(["bench", *argv])).families

    assert families("all") == ["llama"]
    assert families("stack") == ["gpt", "llama"]
    assert families("all", "--families", "gpt,llama") == ["gpt", "llama"]
    assert families("stack", "--families", "gpt") == ["gpt"]


def _aliased_all_reduce_counted() -> float:
    import types

    import torch
    import torch.distributed as dist

    from harness.runtime.comm_count import counted_collectives
    from harness.runtime.rank import rank_device

    module = types.ModuleType("a_third_party")  # what megatron-core does: a collective taken by value at import
    module.reduce = dist.all_reduce
    import sys

    sys.modules[module.__name__] = module
    try:
        counter = [0.0]
        with counted_collectives(counter):
            module.reduce(torch.ones(256, device=rank_device()))
        return counter[0]
    finally:
        del sys.modules[module.__name__]
        assert module.reduce is dist.all_reduce  # restored


def test_a_collective_a_module_holds_under_its_own_name_is_counted(world_cache):
    """A ring all-reduce of 1 KiB over 2 ranks sends 2 (n - 1) / n x 1 KiB = 1 KiB per rank."""
    assert world_cache.get(2).run(_aliased_all_reduce_counted, timeout=60) == [1024.0, 1024.0]


TINY = {"world_size": 2, "vocab": 13, "hidden": 16, "heads": 8, "ffn": 32, "layers": 2, "seq": 4, "rows": 1}


def test_a_case_a_stack_raises_in_is_a_failed_row_and_the_sweep_goes_on(world_cache, tmp_path):
    """``suites.stack.raises:RaisesAtPipeline`` raises on rank 1 at pp 2 from its third step: the sweep's second
    round (one warm-up step and one timed step in the first). That case is a failed row naming rank 1's exception,
    no timing; the cases after it in that round ran on a World respawned for them (their trainers rebuilt and warmed
    up again), and every other case is ok — each row written."""
    cfg = StackSweep(impls=["reference", "suites.stack.raises:RaisesAtPipeline"], families=["gpt"], iters=2, warmup=1,
                     layouts=[(1, 2, 1), (2, 1, 1)], **TINY)
    run = RunDir(tmp_path, {"suite": "stack"})
    assert run_sweep(cfg, world_cache.get, run, progress=None) == 4
    run.finish()
    rows = read_run(run.path)[1]["benchmarks.csv"]
    status = dict(zip(rows["impl"].str.split(":").str[-1] + " " + rows["op"], rows["status"], strict=True))
    assert status == {"reference gpt/1x2x1": "ok", "RaisesAtPipeline gpt/1x2x1": "failed",
                      "reference gpt/2x1x1": "ok", "RaisesAtPipeline gpt/2x1x1": "ok"}
    failed = rows[rows["status"] == "failed"].iloc[0]
    assert failed["detail"].startswith("rank 1: RuntimeError: out of pinned memory at the third step"), failed["detail"]
    assert failed[["time_p50_us", "tokens_per_s"]].isna().all()
    assert (rows[rows["status"] == "ok"]["time_p50_us"] > 0).all()


def steps_of_a_trainer_built_in_a_later_round(warmup: int) -> int:
    """Rank side: the steps ``bench_rank`` takes with a trainer it has not kept (a World respawned after a failed
    case) when a later round asks for no warm-up."""
    from harness.adapters.reference.stack import ReferenceStackTrainer
    from harness.stack import bench

    taken, step = [], ReferenceStackTrainer.step

    def counted(self, tokens, targets):
        taken.append(1)
        return step(self, tokens, targets)

    ReferenceStackTrainer.step = counted
    try:
        bench.release_rank()
        bench.bench_rank(StackSweep(warmup=warmup, **TINY), "reference", "gpt", (2, 1, 1), 0)
    finally:
        ReferenceStackTrainer.step = step
        bench.release_rank()
    return len(taken)


def test_a_trainer_rebuilt_in_a_later_round_is_warmed_up_as_in_the_first(world_cache):
    """Its timed step is not its first: the sweep's warm-up steps, then the timed one."""
    assert world_cache.get(2).run(steps_of_a_trainer_built_in_a_later_round, 2, timeout=120) == [3, 3]
