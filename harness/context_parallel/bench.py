"""``paritybench bench context_parallel``: one Llama attention layer's forward + backward per implementation
(ours: ring and Ulysses; DeepSpeed-Ulysses where installed) against the sequence length and cp — the time
(per iteration the max over ranks), and the bytes each rank sends, counted (``comm_count.counted_traffic``:
sends and all-to-alls), against ``cost_model.cp_layer_comm_bytes``. Rows: suite ``context_parallel``, ``op``
``<layout>/seq<n>``, ``count`` the sequence length, ``world_size`` cp. The one-device attention over the
whole sequence is timed too (``impl`` ``one-device``, world size 1): what cp is measured against.

On 2 CPU cores, 4 ranks are oversubscribed: compare implementations at one cp, and one implementation's
growth with the sequence, not cp sizes with each other."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.records.tables import NO_ROWS, not_provided, opening
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.comm_count import counted_traffic
from harness.runtime.timing import summarize, time_iterations


@dataclass
class ContextParallelSweep:
    impls: list[str] = field(default_factory=lambda: ["reference-ring", "reference-ulysses"])
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    seqs: list[int] = field(default_factory=lambda: [256, 1024, 2048])
    layout: str = "zigzag"
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    batch: int = 1
    iters: int = 5
    warmup: int = 1


def bench_rank(impl_spec: str, cfg: ContextParallelSweep, seq: int) -> dict:
    import torch
    import torch.distributed as dist

    from harness.runtime.rank import rank_device
    from reference.context_parallel import layout as layouts
    from reference.models import GQAttention

    cp, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    torch.manual_seed(0)
    dense = GQAttention(cfg.hidden, cfg.heads, cfg.kv_heads, dtype=torch.float32).to(device)
    x = torch.randn(cfg.batch, seq, cfg.hidden, device=device)
    if impl_spec == "one-device":
        xd = x.requires_grad_()

        def step():
            dense(xd, torch.arange(seq, device=device)).sum().backward()
        return {"times": time_iterations(step, cfg.iters, cfg.warmup, device), "bytes_sent": 0.0}
    try:
        module = registry.load(impl_spec, "context_parallel").shard(dense, dist.group.WORLD, cfg.layout)
        x_local = layouts.shard(x, cp, r, cfg.layout).requires_grad_()
        counter = [0.0]
        with counted_traffic(counter):
            module(x_local).sum().backward()
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc).splitlines()[0]}

    def step():
        module(x_local).sum().backward()
    return {"times": time_iterations(step, cfg.iters, cfg.warmup, device), "bytes_sent": counter[0]}


def run_sweep(cfg: ContextParallelSweep, get_world, run_dir, progress=STDERR) -> int:
    from reference.cost_model import cp_layer_comm_bytes

    cases = [(1, "one-device", seq) for seq in cfg.seqs]
    cases += list(itertools.product(cfg.world_sizes, cfg.impls, cfg.seqs))
    for done, (n, impl, seq) in enumerate(cases, 1):
        world = get_world(n)
        per_rank = call_case(world, bench_rank, impl, cfg, seq)
        row = {"suite": "context_parallel", "op": f"{cfg.layout}/seq{seq}", "impl": impl, "backend": world.backend,
               "world_size": n, "dtype": "float32", "iters": cfg.iters, "warmup": cfg.warmup, "count": seq}
        algorithm = "ring" if impl.endswith("ring") else "ulysses"
        if impl != "one-device":
            row["comm_bytes_predicted"] = cp_layer_comm_bytes(algorithm, cfg.batch, seq, cfg.heads, cfg.kv_heads,
                                                              cfg.hidden // cfg.heads, n, element_size=4)["total"]
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            row.update(status="ok", comm_bytes_measured=max(r["bytes_sent"] for r in per_rank),
                       **summarize([r["times"] for r in per_rank]))
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] context_parallel cp={n} {impl} seq {seq}: {extra}", file=progress, flush=True)
    return len(cases)


def context_parallel_section(rows, run_dir, md) -> list[str]:
    """The report section: per cp, each implementation's step time and bytes against the sequence."""
    ok, out = opening(rows, "## Context parallelism: one attention layer, forward + backward",
                      "A Llama attention layer over a CP group (the sequence split by the zigzag layout), per "
                      "implementation and sequence length; `one-device`: the same layer over the whole sequence on "
                      "one rank. Bytes: the busiest rank's, counted, against `cost_model.cp_layer_comm_bytes` (ring: "
                      "2 cp - 1 K/V blocks over forward and backward; Ulysses: four all-to-alls each way).")
    if not len(ok):
        return out + NO_ROWS
    ok["seq"] = ok["count"].astype(int)
    ok["ms"] = ok["time_p50_us"] / 1e3
    cols = ["world_size", "impl", "seq", "ms", "comm_bytes_measured", "comm_bytes_predicted"]
    out += [md(ok.sort_values(["world_size", "impl", "seq"])[cols], ".4g", index=False), ""]
    return out + not_provided(rows, md, ["world_size", "impl", "op", "detail"])
