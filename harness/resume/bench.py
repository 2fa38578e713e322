"""``paritybench bench resume``: save and load of a stack's training state per layout, through the stack contract
(``save`` / ``load``; the reference stack's by default) —
time, throughput (GB/s, GB = 1e9: the checkpoint's bytes / time), bytes the busiest rank writes against
the model state a rank owns when saving splits it over all N ranks (``cost_model.training_memory`` at
ZeRO-3 sharding: float32 weights and SGD momentum, (4 + 4) Psi / N; replicated LayerNorms and the
vocabulary's uneven split make the measured a little larger)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.runtime.bench_case import STDERR, call_case, declined


@dataclass
class ResumeSweep:
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    layouts: list = field(default_factory=list)
    """(dp, pp, tp) to run; empty: every layout of each world size the model takes."""
    zero_stage: int = 1
    vocab: int = 512
    hidden: int = 128
    heads: int = 8
    ffn: int = 512
    layers: int = 8
    iters: int = 3
    warmup: int = 1
    impl: str = "reference"
    """The stack whose save / load is timed (through the stack contract)."""


def _layouts(cfg: ResumeSweep, n: int) -> list[tuple[int, int, int]]:
    if cfg.layouts:
        return [tuple(d) for d in cfg.layouts if d[0] * d[1] * d[2] == n]
    return [(dp, pp, n // (dp * pp)) for dp in range(1, n + 1) for pp in range(1, n + 1)
            if n % (dp * pp) == 0 and cfg.heads % (n // (dp * pp)) == 0 and pp <= cfg.layers]


def bench_rank(cfg: ResumeSweep, dims_t, root: str) -> dict:
    """Rank side: the stack ``cfg.impl`` (the reference's by default) built through the stack contract on
    ``dims_t``, one step taken (its momentum exists), then ``save`` / ``load`` timed ``warmup + iters`` times."""
    import torch
    import torch.distributed as dist

    from harness.contracts.stack import Layout, Recipe
    from harness.records import registry
    from reference.models import ModelSpec
    from reference.zero import OptimizerSpec

    spec = ModelSpec("gpt", vocab=cfg.vocab, hidden=cfg.hidden, heads=cfg.heads, ffn=cfg.ffn, layers=cfg.layers,
                     dtype="float32")
    layout = Layout(*dims_t, zero=cfg.zero_stage, microbatches=dims_t[1])
    try:
        trainer = registry.load(cfg.impl, "stack").build(spec, layout, Recipe(optimizer=OptimizerSpec("sgd", 1e-3)))
    except (NotImplementedError, ValueError) as exc:  # the stack does not provide the case: its one sentence
        return {"unsupported": str(exc).splitlines()[0]}
    if not (callable(getattr(trainer, "save", None)) and callable(getattr(trainer, "load", None))):
        return {"unsupported": f"{cfg.impl} provides no save / load (optional in the stack contract)."}
    if hasattr(trainer, "activate"):  # a stack with process-global parallel state (megatron-core)
        trainer.activate()
    dense = spec.build(0)
    trainer.load_dense(dense.state_dict())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (layout.dp * layout.num_microbatches, 16), generator=gen)
    trainer.step(tokens, tokens)  # the momentum exists from the first step on
    saves, loads = [], []
    for i in range(cfg.warmup + cfg.iters):
        directory = Path(root) / f"step-{i}"
        dist.barrier()
        t0 = time.perf_counter()
        trainer.save(directory)
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        trainer.load(directory)
        t3 = time.perf_counter()
        if i >= cfg.warmup:
            saves.append(t1 - t0)
            loads.append(t3 - t2)
        dist.barrier()
        if dist.get_rank() == 0 and i:
            shutil.rmtree(Path(root) / f"step-{i - 1}")  # keep the disk to one step or two
    # the state's bytes: the reference store's per-rank shard files (its metadata aside); another stack's: every
    # file it wrote, each rank's share of it an even one
    files = [f for f in directory.rglob("*") if f.is_file()]
    shards = [f for f in files if f.name.startswith("rank") and f.suffix == ".bin"] or files
    total = sum(f.stat().st_size for f in shards)
    mine = f"rank{dist.get_rank():05d}.bin"
    written = sum(f.stat().st_size for f in shards if f.name == mine) or total // dist.get_world_size()
    return {"save": saves, "load": loads, "written": written, "total": total,
            "numel": sum(p.numel() for p in dense.parameters())}


def run_sweep(cfg: ResumeSweep, get_world, run_dir, progress=STDERR) -> int:
    rows = 0
    for n in cfg.world_sizes:
        for dims in _layouts(cfg, n):
            root = Path(run_dir.path) / f"resume-{'x'.join(map(str, dims))}"
            world = get_world(n)
            try:
                per_rank = call_case(world, bench_rank, cfg, dims, str(root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            dp, pp, tp = dims
            said = declined(per_rank)  # the implementation raised, died or hung: save and load rows saying so
            for what in ("save", "load"):
                row = {"suite": "resume", "op": f"{what} {dp}x{pp}x{tp}", "impl": cfg.impl, "backend": world.backend,
                       "world_size": n, "dtype": "float32", "zero_stage": cfg.zero_stage, "iters": cfg.iters,
                       "warmup": cfg.warmup, **(said or _measured(per_rank, what, dims))}
                run_dir.append("benchmarks.csv", row)
                rows += 1
            if progress:
                r0 = per_rank[0]
                print(f"resume {dp}x{pp}x{tp}: " + (said["status"] if said else
                      f"checkpoint {r0['total'] / 1e6:.1f} MB, busiest rank "
                      f"{max(r['written'] for r in per_rank) / 1e6:.2f} MB"), file=progress, flush=True)
    return rows


def _measured(per_rank: list[dict], what: str, dims) -> dict:
    """A save or load row's figures: its times over ranks, the checkpoint's bytes, the busiest rank's file."""
    from harness.runtime.timing import summarize
    from reference.cost_model import training_memory

    r0 = per_rank[0]
    dp, pp, tp = dims
    states = training_memory(r0["numel"], zero_stage=3, dp=dp, tp=tp, pp=pp, weight_bytes=4, grad_bytes=4,
                             optimizer_bytes=4)
    stats = summarize([r[what] for r in per_rank])
    return {"count": r0["numel"], "bytes": r0["total"], "status": "ok",
            "algbw_gbps": r0["total"] / (stats["time_p50_us"] * 1e-6) / 1e9,
            "state_bytes_rank_max": max(r["written"] for r in per_rank),
            "state_bytes_predicted": states.weights + states.optimizer, **stats}


def resume_section(rows, run_dir, md) -> list[str]:
    ok = rows[rows["status"] == "ok"].copy()
    if not len(ok):
        return []
    ok["layout"] = ok["op"].str.split(" ").str[1]
    ok["what"] = ok["op"].str.split(" ").str[0]
    ok["ms"] = ok["time_p50_us"] / 1e3
    table = ok.pivot_table(index=["world_size", "layout", "bytes", "state_bytes_rank_max", "state_bytes_predicted"],
                           columns="what", values=["ms", "algbw_gbps"], aggfunc="first")
    table.columns = [f"{what} {v}" for v, what in table.columns]
    return ["## Resume: save and load of the 3D stack's training state", "",
            "Reference format (`reference/state`): every rank writes its ZeRO range of its tensor-parallel boxes, "
            "rank 0 publishes with one rename; load reads only the boxes a rank needs, checksummed. `bytes`: the whole "
            "checkpoint; `state_bytes_rank_max`: the busiest rank's file; predicted: float32 weights + momentum split "
            "over all ranks (cost_model). GB/s = bytes / p50 time.", "",
            md(table.reset_index(), ".4g", index=False), ""]
