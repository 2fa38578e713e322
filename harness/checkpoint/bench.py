"""The activation-checkpointing benchmark: per layer count L, step time (forward + backward) and peak
activation memory (bytes of saved tensors, ``measure.SavedTensorMeter``) per implementation x policy,
against no checkpointing and ``cost_model``: memory ``sqrt_checkpoint_memory`` (ceil(L/k) + k layers'
activations at k ~ sqrt(L)) and compute ``recompute_overhead`` (+1/3 with backward = 2 x forward).

One process (checkpointing needs no communication): a stack of L Linear-GELU layers, float32, on the GPU
where there is one (then the allocator's peak is recorded too, ``alloc_peak_bytes``), else the CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harness.records import registry
from harness.runtime.bench_case import STDERR, failed_in_driver
from harness.runtime.timing import summarize
from reference.cost_model import recompute_overhead, sqrt_checkpoint_memory


@dataclass
class CheckpointSweep:
    impls: list[str] = field(default_factory=lambda: ["reference", "torch", "torch-reentrant"])
    """Implementations of the ``checkpoint`` contract."""
    layers: list[int] = field(default_factory=lambda: [4, 16, 64])
    """Layer counts L."""
    policies: list[str] = field(default_factory=lambda: ["layer", "sqrt"])
    """Checkpointing policies (every row is also measured without checkpointing)."""
    hidden: int = 256
    batch: int = 64
    iters: int = 10
    warmup: int = 2


def measure(module, x, iters: int, warmup: int) -> dict:
    import torch

    from .measure import SavedTensorMeter

    def step():
        module.zero_grad(set_to_none=True)
        module(x).pow(2).sum().backward()

    meter = SavedTensorMeter(exclude=list(module.parameters()))
    if x.is_cuda:  # the allocator's own peak, where there is one (CUDA); blank on the CPU
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with meter.measure():
        step()
    alloc_peak = torch.cuda.max_memory_allocated() - base if x.is_cuda else None
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"peak": meter.peak, "alloc_peak": alloc_peak, "stats": summarize([times])}


def run_sweep(cfg: CheckpointSweep, get_world, run_dir, progress=STDERR) -> int:
    import torch
    from torch import nn

    torch.manual_seed(0)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    rows = 0
    for count in cfg.layers:
        def stack(count=count):
            torch.manual_seed(0)
            return [nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU()).to(device) for _ in range(count)]

        x = torch.randn(cfg.batch, cfg.hidden, device=device, requires_grad=True)
        plain = measure(nn.Sequential(*stack()), x, cfg.iters, cfg.warmup)
        per_layer = plain["peak"] / count  # what one layer saves without checkpointing
        cases = [("none", "none", plain)] + [(impl, policy, None) for impl in cfg.impls for policy in cfg.policies]
        for impl, policy, got in cases:
            row = {"suite": "checkpoint", "op": policy, "impl": impl, "world_size": 1, "dtype": "float32",
                   "count": count, "iters": cfg.iters, "warmup": cfg.warmup, "backend": "none"}
            if got is None:
                try:
                    got = measure(registry.load(impl, "checkpoint").wrap(stack(), policy), x, cfg.iters, cfg.warmup)
                except NotImplementedError as exc:
                    run_dir.append("benchmarks.csv", {**row, "status": "unsupported", "detail": str(exc)})
                    continue
                except Exception as exc:  # noqa: BLE001 - the implementation's failure is the case's verdict
                    run_dir.append("benchmarks.csv", {**row, **failed_in_driver(exc)})
                    continue
            # cost_model's convention (Chen et al.): a kept segment input counts as one layer's activations
            # (here it is half of them: Linear and GELU each save their input), k segments: ceil(L/k) + k.
            predicted = {"none": count * per_layer, "layer": (1 + count) * per_layer,
                         "sqrt": sqrt_checkpoint_memory(count, per_layer)}.get(policy)
            row.update(status="ok", **got["stats"],
                       act_peak_bytes=got["peak"], act_peak_predicted=predicted, alloc_peak_bytes=got["alloc_peak"],
                       recompute_overhead_measured=got["stats"]["time_p50_us"] / plain["stats"]["time_p50_us"] - 1,
                       recompute_overhead_predicted=0.0 if policy == "none" else recompute_overhead())
            run_dir.append("benchmarks.csv", row)
            rows += 1
            step_ms = got["stats"]["time_p50_us"] / 1e3
            print(f"checkpoint L={count} {impl} {policy}: peak {got['peak']} B, {step_ms:.2f} ms", file=progress)
    return rows
