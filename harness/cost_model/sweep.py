"""The calibration sweep: what ``paritybench calibrate`` (and ``bench all``, ``bench 3d``, ``bench
pipeline`` before their predictions) measures, one row per case into the run folder's calibration.csv.

At each world size n, with every rank busy at once (as in training):
- collectives: for each group size g dividing n (g >= 2), the n / g groups of consecutive ranks run the
  same collective at the same time, timed over a range of sizes (the fit needs both ends: latency-bound
  and bandwidth-bound);
- point-to-point: ranks paired (0,1), (2,3), ...; the even rank sends a message and waits for it to come
  back: ``send`` is what the sender pays to post and complete its send (the pipeline runtime pays it per
  message), ``one_way`` is half the round trip; ``loaded`` is what a message costs ranks that are
  computing (GEMMs with and without messages between them: on 2 cores gloo's threads take it from compute);
- compute: every rank runs forward + backward of ``linear`` at the given (rows, in, out) shapes (the
  models' GEMMs: 6 rows in out FLOPs each), and of one whole layer of each benchmarked model, per dtype.
Timing as everywhere (``harness.runtime.timing``): per iteration after a barrier, max over ranks, median kept.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.runtime.bench_case import STDERR

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")

_GROUPS: dict = {}  # (world size, group size) -> this rank's group, created once per rank process


@dataclass
class CalibrationSweep:
    world_sizes: list[int] = field(default_factory=lambda: [2])
    ops: list[str] = field(default_factory=lambda: list(OPS))
    sizes: list[int] = field(default_factory=lambda: [1 << 10, 1 << 14, 1 << 18, 1 << 21, 1 << 23])
    """Bytes per collective buffer and per message (1 KiB-8 MiB: the 3D bench's DP buffer is ~7 MB)."""
    dtypes: list[str] = field(default_factory=lambda: ["float32"])
    shapes: list[tuple[int, int, int]] = field(default_factory=lambda: [
        (128, 128, 384), (128, 128, 128), (128, 128, 512), (128, 512, 128), (64, 512, 512)])
    """(rows, in, out) of the GEMMs timed: the 3D bench GPT's (128 tokens, h 128, ffn 512) and the pipeline
    bench's (64 rows, h 512)."""
    blocks: list[dict] = field(default_factory=lambda: [
        {"kind": "gpt_block", "hidden": 128, "heads": 8, "ffn": 512, "seq": 64, "rows": 2},
        {"kind": "mlp_layer", "hidden": 512, "rows": 64}])
    """Whole layers of the benchmarked models, timed forward + backward: their time beyond their GEMMs at the
    matmul rate is the per-layer overhead (norms, softmax, activations, dispatch) that tensor parallelism does
    not divide."""
    iters: int = 6
    warmup: int = 1


def _group(g: int):
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    if (n, g) not in _GROUPS:
        mine = None
        for start in range(0, n, g):  # new_group is collective: every rank creates every group, in order
            group = dist.new_group(list(range(start, start + g)))
            mine = group if start <= rank < start + g else mine
        _GROUPS[(n, g)] = mine
    return _GROUPS[(n, g)]


BURST = 5
"""Collectives and layers timed back to back per sample (the time is per one): as a step runs them, so
the ranks' skew leaving the barrier is paid once per burst, and on an oversubscribed host every rank
competes for the cores the whole time, as in training."""
LONG_BURST_BYTES = 1 << 20
"""From this size on a collective's burst is 2: one such collective already keeps every rank busy for tens of
milliseconds, so the skew is amortised and the cores contended without five of them (the 2 and 8 MiB cases were
60 % of ``bench all``'s calibration at 8 ranks)."""


def collective_rank(op: str, g: int, nbytes: int, iters: int, warmup: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from harness.runtime.rank import rank_device
    from harness.runtime.timing import time_iterations

    device, group = rank_device(), _group(g)
    numel = max(g, nbytes // 4 // g * g)  # float32, divisible by the group for the sharded ones
    buf = torch.ones(numel, device=device)
    out = torch.empty(numel // g if op == "reduce_scatter" else numel, device=device)
    shard = torch.ones(numel // g, device=device)
    root = dist.get_global_rank(group, 0)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer name where it exists
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    step = {"all_reduce": lambda: dist.all_reduce(buf, group=group),
            "all_gather": lambda: gather(out, shard, group=group),
            "reduce_scatter": lambda: scatter(out, buf, group=group),
            "broadcast": lambda: dist.broadcast(buf, root, group=group)}[op]

    count = BURST if nbytes < LONG_BURST_BYTES else 2

    def burst():
        for _ in range(count):
            step()

    return [t / count for t in time_iterations(burst, iters, warmup, device)]


def p2p_rank(nbytes: int, iters: int, warmup: int) -> dict:
    """Even ranks: (send, round trip) seconds per iteration; odd ranks echo; an odd world's last rank only
    joins the barriers."""
    import time

    import torch
    import torch.distributed as dist

    from harness.runtime.rank import rank_device

    device, rank, n = rank_device(), dist.get_rank(), dist.get_world_size()
    buf = torch.ones(max(1, nbytes // 4), device=device)
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    sends, trips = [], []
    for i in range(warmup + iters):
        dist.barrier()
        if peer >= n:
            continue
        if rank % 2 == 0:
            t0 = time.perf_counter()
            dist.isend(buf, peer).wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            dist.irecv(buf, peer).wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t2 = time.perf_counter()
            if i >= warmup:
                sends.append(t1 - t0)
                trips.append(t2 - t0)
        else:
            dist.irecv(buf, peer).wait()
            dist.isend(buf, peer).wait()
    return {"send": sends, "one_way": [t / 2 for t in trips]}


LOADED_MESSAGES = 8


def loaded_p2p_rank(nbytes: int, iters: int, warmup: int) -> list[float]:
    """Per iteration, what one message costs ranks that are computing: every rank runs the same GEMMs
    with and without ``LOADED_MESSAGES`` messages to / from its pair posted between them, and the difference
    per message is kept (on a host with fewer cores than busy threads the transport's threads take their
    time from compute; where they do not, it is ~0)."""
    import time

    import torch
    import torch.distributed as dist

    from harness.runtime.rank import rank_device

    device, rank, n = rank_device(), dist.get_rank(), dist.get_world_size()
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    w, x = torch.randn(512, 512, device=device), torch.randn(64, 512, device=device)
    buf = torch.ones(max(1, nbytes // 4), device=device)

    def run(messages: bool) -> float:
        dist.barrier()
        t0, works = time.perf_counter(), []
        for _ in range(LOADED_MESSAGES):
            if messages and peer < n:
                works.append(dist.isend(buf, peer) if rank % 2 == 0 else dist.irecv(torch.empty_like(buf), peer))
            for _ in range(4):
                x @ w
        for work in works:
            work.wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    out = []
    for i in range(warmup + iters):
        alone, loaded = run(False), run(True)
        if i >= warmup:
            out.append(max(1e-6, (loaded - alone) / LOADED_MESSAGES))
    return out


def matmul_rank(dtype_name: str, shapes: list, iters: int, warmup: int) -> list[float]:
    import torch
    import torch.nn.functional as F

    from harness.runtime.rank import rank_device
    from harness.runtime.timing import time_iterations

    device, dtype = rank_device(), getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(r, i, generator=gen).to(device, dtype).requires_grad_(),
             torch.randn(o, i, generator=gen).to(device, dtype).requires_grad_()) for r, i, o in shapes]

    def step():
        for _ in range(BURST):
            for x, w in data:
                F.linear(x, w).sum().backward()

    return [t / BURST for t in time_iterations(step, iters, warmup, device)]


def block_flops(spec: dict) -> float:
    """Forward + backward FLOPs of one layer (3x the forward GEMMs, ``predict``'s formulas)."""
    from harness.cost_model.predict import gpt_workload, mlp_workload

    if spec["kind"] == "gpt_block":
        work = gpt_workload(1, spec["hidden"], spec["heads"], spec["ffn"], 1, spec["seq"], spec["rows"])
    else:
        work = mlp_workload(1, spec["hidden"], spec["rows"])
    return 3 * work.layer_flops


def block_rank(dtype_name: str, spec: dict, iters: int, warmup: int) -> list[float]:
    import torch
    from torch import nn

    from harness.runtime.rank import rank_device
    from harness.runtime.timing import time_iterations
    from reference.models import GPTBlock

    device, dtype = rank_device(), getattr(torch, dtype_name)
    torch.manual_seed(0)
    if spec["kind"] == "gpt_block":
        layer = GPTBlock(spec["hidden"], spec["heads"], spec["ffn"], dtype=dtype).to(device)
        x = torch.randn(spec["rows"], spec["seq"], spec["hidden"], dtype=dtype, device=device, requires_grad=True)
    else:
        layer = nn.Sequential(nn.Linear(spec["hidden"], spec["hidden"], dtype=dtype), nn.ReLU()).to(device)
        x = torch.randn(spec["rows"], spec["hidden"], dtype=dtype, device=device, requires_grad=True)
    def step():
        for _ in range(BURST):
            layer(x).sum().backward()

    return [t / BURST for t in time_iterations(step, iters, warmup, device)]


def _row(world, kind: str, op: str, g, dtype: str, nbytes, flops, cfg, per_rank) -> dict:
    from harness.runtime.timing import summarize

    stats = summarize(per_rank)
    stats.pop("samples_us", None)
    return {"backend": world.backend, "world_size": world.size, "kind": kind, "op": op, "group_size": g,
            "dtype": dtype, "bytes": nbytes, "flops": flops, "iters": cfg.iters, "warmup": cfg.warmup, **stats}


def run_sweep(cfg: CalibrationSweep, get_world, run_dir, progress=STDERR) -> int:
    rows = 0
    for n in cfg.world_sizes:
        world = get_world(n)
        groups = [g for g in range(2, n + 1) if n % g == 0]
        for g in groups:
            for op in cfg.ops:
                for nbytes in cfg.sizes:
                    per_rank = world.run(collective_rank, op, g, nbytes, cfg.iters, cfg.warmup, timeout=600)
                    run_dir.append("calibration.csv", _row(world, "collective", op, g, "float32", nbytes, None, cfg,
                                                           per_rank))
                    rows += 1
        if n >= 2:
            for nbytes in cfg.sizes:
                per_rank = world.run(p2p_rank, nbytes, cfg.iters, cfg.warmup, timeout=600)
                for what in ("send", "one_way"):
                    evens = [r[what] for r in per_rank[:n - n % 2:2]]
                    run_dir.append("calibration.csv", _row(world, "p2p", what, 2, "float32", nbytes, None, cfg, evens))
                # the difference of two noisy times: three times the samples
                per_rank = world.run(loaded_p2p_rank, nbytes, 3 * cfg.iters, cfg.warmup, timeout=600)
                # a difference of two noisy times per rank: per iteration the median over ranks, not the max
                typical = [statistics.median(it) for it in zip(*per_rank[:n - n % 2], strict=True)]
                run_dir.append("calibration.csv", _row(world, "p2p", "loaded", 2, "float32", nbytes, None, cfg,
                                                       [typical]))
                rows += 3
        flops = sum(6 * r * i * o for r, i, o in cfg.shapes)
        for dtype in cfg.dtypes:
            per_rank = world.run(matmul_rank, dtype, cfg.shapes, cfg.iters, cfg.warmup, timeout=600)
            run_dir.append("calibration.csv", _row(world, "compute", "matmul", 1, dtype, None, flops, cfg, per_rank))
            for spec in cfg.blocks:
                per_rank = world.run(block_rank, dtype, spec, cfg.iters, cfg.warmup, timeout=600)
                run_dir.append("calibration.csv", _row(world, "compute", spec["kind"], 1, dtype, None,
                                                       block_flops(spec), cfg, per_rank))
            rows += 1 + len(cfg.blocks)
        if progress:
            print(f"calibrate: world {n}: collectives on groups of {', '.join(map(str, groups))}, point-to-point, "
                  f"matmul ({', '.join(cfg.dtypes)})", file=progress, flush=True)
    return rows
