"""The collectives benchmark: an nccl-tests-style size sweep over implementations and world sizes.

Bandwidth follows nccl-tests (GB = 1e9 bytes): algbw = S / t with S the whole buffer (all_reduce,
broadcast, reduce: the tensor; all_gather: the gathered output; reduce_scatter: the whole input;
all_to_all: the whole buffer), busbw = algbw * factor with factor 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and all_to_all, 1 for broadcast and reduce. Every row also carries
``wrong``: the number of wrong elements from an exact check of the same implementation at the same
size, run outside the timed loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.timing import summarize, time_iterations
from reference.cost_model import busbw_factor

from .case import COLLECTIVES, REDUCING, Case, call, make_buffers, merge, run_case

ELEMENT_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*factor, ... up to max (inclusive), as nccl-tests' -b/-e/-f."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def case_numel(collective: str, nbytes: int, n: int, elem: int) -> tuple[int, int]:
    """(Case.numel, S in bytes) for a requested size: blocks are whole elements, as in nccl-tests."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        numel = max(1, nbytes // elem)
        return numel, numel * elem
    block = max(1, nbytes // (n * elem))
    return block, n * block * elem


@dataclass
class SweepConfig:
    """What ``paritybench bench collectives`` runs."""

    impls: list[str]
    """Implementation specs (registry names or package.module:object)."""
    ops: list[str] = field(default_factory=lambda: list(COLLECTIVES))
    """Collectives to time."""
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    min_bytes: int = 1024
    max_bytes: int = 64 << 20
    factor: int = 4
    iters: int = 10
    warmup: int = 3
    dtype: str = "float32"
    reduce_op: str = "sum"
    """The reduction for all_reduce, reduce_scatter and reduce."""
    dispatch_iters: int = 200
    """No-op World calls timed per world size (the harness's own overhead)."""


def bench_rank(impl_spec: str, collective: str, dtype: str, numel: int, reduce_op: str,
               iters: int, warmup: int) -> dict:
    """Rank side: exact check once, then time ``iters`` calls on zero-filled buffers."""
    import torch

    from harness.runtime.world import rank_device

    check = run_case(Case(impl_spec, collective, dtype, numel, reduce_op, seed=1))
    if check["outcome"] != "pass" and not check["wrong"]:  # refused, raised, or accepted what the contract leaves out
        return {**check, "times": []}  # no number to publish (and a raise would only raise again in the timed loop)
    impl = registry.load(impl_spec, "collectives")
    timed = Case(impl_spec, collective, dtype, numel, reduce_op)
    # zeros stay zeros under every op: no overflow, no denormals across iterations
    out, inp = make_buffers(timed, torch.distributed.get_rank(), torch.distributed.get_world_size(), rank_device(),
                            zeros=True)
    # the exact check just ran the same collective at the same size: it is the first warm-up iteration
    times = time_iterations(lambda: call(impl, timed, out, inp, None), iters, max(0, warmup - 1), rank_device())
    return {**check, "times": times}


def noop() -> None:
    """The cheapest possible World call."""


def dispatch_row(world, iters: int) -> dict:
    """Time ``iters`` warm no-op ``World.run`` calls from the driver: the harness's own overhead."""
    import time

    world.run(noop)
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        world.run(noop)
        samples.append(time.perf_counter() - t0)
    return {"suite": "world", "op": "dispatch_noop", "impl": "world", "backend": world.backend,
            "world_size": world.size, "iters": iters, "warmup": 1, "status": "ok", "wrong": 0,
            **summarize([samples])}


def run_sweep(cfg: SweepConfig, get_world, run_dir, progress=STDERR) -> int:
    """Run the sweep, appending a benchmark and a conformance row per case; return rows written."""
    sizes = sweep_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)
    # per size, every implementation of a collective in a row: they share the oracle's expected output
    # (``case.expected`` keeps the last), and a drift of the machine lands on each implementation alike
    pairs = [(impl, op) for op in cfg.ops for impl in cfg.impls if _own(impl, op)]
    total = len(cfg.world_sizes) * len(pairs) * len(sizes)
    done = 0
    for n in cfg.world_sizes:
        world = get_world(n)
        run_dir.append("benchmarks.csv", dispatch_row(world, cfg.dispatch_iters))
        for nbytes, (impl, collective) in itertools.product(sizes, pairs):
            done += 1
            row = _one(world, cfg, impl, collective, nbytes)
            numel, outcome = row.pop("numel"), row.pop("outcome")
            run_dir.append("benchmarks.csv", row)
            run_dir.append("conformance.csv", _conformance_row(row, numel, outcome))
            if progress:
                bw = f"busbw {row['busbw_gbps']:.3f} GB/s" if row["status"] == "ok" else row["status"]
                wrong = f" WRONG={row['wrong']}" if row["wrong"] else ""
                print(f"[{done}/{total}] n={n} {impl} {collective} {row['bytes']} B: {bw}{wrong}",
                      file=progress, flush=True)
    return done


def _own(impl: str, collective: str) -> bool:
    """False for a variant that shares this collective with another implementation (no new number)."""
    return registry.resolve(impl, "collectives").owns(collective)


def _one(world, cfg: SweepConfig, impl: str, collective: str, nbytes: int) -> dict:
    n = world.size
    elem = ELEMENT_BYTES[cfg.dtype]
    numel, s_bytes = case_numel(collective, nbytes, n, elem)
    per_rank = call_case(world, bench_rank, impl, collective, cfg.dtype, numel, cfg.reduce_op, cfg.iters,
                         cfg.warmup, timeout=max(120.0, world.timeout))
    row = {"suite": "collectives", "op": collective, "impl": impl, "backend": world.backend,
           "world_size": n, "dtype": cfg.dtype, "bytes": s_bytes, "count": s_bytes // elem,
           "reduce_op": cfg.reduce_op if collective in REDUCING else "", "iters": cfg.iters,
           "warmup": cfg.warmup, "numel": numel}
    said = declined(per_rank)
    if said:  # a rank raised, died or hung outside the exact check's own catch: the case's verdict, no timing
        return {**row, **said, "wrong": 0, "outcome": "fail"}
    verdict = merge(per_rank)
    row.update(wrong=verdict["wrong"], detail=verdict["detail"], outcome=verdict["outcome"])
    # the check's own failure (wrong elements, an out-of-contract call accepted) is wrong; a raise, or an error of
    # the oracle itself, is failed, as a raise is in every bench (harness.runtime.bench_case)
    raised = any(r.get("raised") for r in per_rank)
    status = {"pass": "ok", "fail": "failed" if raised else "wrong", "unsupported": "unsupported"}.get(
        verdict["outcome"], "failed")
    if not any(r["times"] for r in per_rank):  # the check refused, raised or failed without wrong elements
        return {**row, "status": status}
    stats = summarize([r["times"] for r in per_rank])
    algbw = s_bytes / (stats["time_p50_us"] * 1e-6) / 1e9 if stats["time_p50_us"] > 0 else 0.0
    return {**row, **stats, "status": status, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(collective, n)}


def _conformance_row(row: dict, numel: int, outcome: str) -> dict:
    """``outcome``: the exact check's verdict (``merge``), or fail where the World call itself failed."""
    return {"suite": "collectives", "property": "bench_exact_check", "impl": row["impl"],
            "backend": row["backend"], "world_size": row["world_size"], "dtype": row["dtype"],
            "collective": row["op"], "op": row["reduce_op"], "numel": numel, "root": 0,
            "in_place": False, "group": "", "seed": 1, "outcome": outcome, "wrong": row["wrong"],
            "detail": row["detail"]}
