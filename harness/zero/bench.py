"""The data-parallel / ZeRO benchmark: step time and per-rank memory of model state per implementation x
stage x DP size, next to ``cost_model.training_memory``; bytes sent per step, counted where the
implementation calls torch.distributed's collectives (ours; DDP's C++ reducer and FSDP2's functional
collectives are not seen: blank), next to ``cost_model.dp_step_comm_bytes`` (2 Psi, or 3 Psi for ZeRO-3).

The model is one transformer block (reference.models.TransformerBlock) in float32 trained with Adam:
K = 8 bytes of optimizer state per parameter, 4-byte weights and gradients.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field

from reference.cost_model import dp_step_comm_bytes, training_memory

from .. import registry
from ..comm_count import counted_collectives
from ..timing import summarize, time_iterations


@dataclass
class ZeroSweep:
    impls: list[str] = field(default_factory=lambda: ["reference", "torch", "deepspeed"])
    """Implementations of the ``zero`` contract."""
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    """Data-parallel sizes N."""
    stages: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    """ZeRO stages (0: plain data parallelism)."""
    hidden: int = 256
    """Transformer block width (heads = hidden / 64, ffn = 4 hidden)."""
    seq: int = 32
    """Sequence length of each sample."""
    batch: int = 4
    """Samples per rank per step."""
    iters: int = 10
    warmup: int = 3


def bench_rank(impl_spec: str, stage: int, hidden: int, seq: int, batch: int, iters: int, warmup: int) -> dict:
    import torch

    from reference.models import TransformerBlock
    from reference.zero import OptimizerSpec

    from ..world import rank_device

    device = rank_device()
    torch.manual_seed(0)
    model = TransformerBlock(hidden, max(1, hidden // 64), 4 * hidden, dtype=torch.float32).to(device)
    numel = sum(p.numel() for p in model.parameters())
    try:
        trainer = registry.load(impl_spec, "zero").build(model, OptimizerSpec("adam", 1e-4), stage, None)
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc)}
    x = torch.randn(batch, seq, hidden, device=device)
    y = torch.randn(batch, seq, hidden, device=device)

    def step():
        trainer.step(x, y)

    step()  # the optimizer state exists from the first step on
    counter = [0.0]
    with counted_collectives(counter):
        step()
    return {"times": time_iterations(step, iters, warmup, device), "bytes_sent": counter[0],
            "memory": trainer.memory(), "numel": numel}


def run_sweep(cfg: ZeroSweep, get_world, run_dir, progress=sys.stderr) -> int:
    cases = [(n, impl, stage) for n, impl, stage in itertools.product(cfg.world_sizes, cfg.impls, cfg.stages)
             if registry.resolve(impl, "zero").owns(f"stage{stage}")]  # reference-naive: stage 0 only
    for done, (n, impl, stage) in enumerate(cases, 1):
        world = get_world(n)
        per_rank = world.run(bench_rank, impl, stage, cfg.hidden, cfg.seq, cfg.batch, cfg.iters, cfg.warmup,
                             timeout=600)
        row = {"suite": "zero", "op": f"stage{stage}", "zero_stage": stage, "impl": impl, "backend": world.backend,
               "world_size": n, "dtype": "float32", "iters": cfg.iters, "warmup": cfg.warmup,
               "count": cfg.batch * cfg.seq}
        unsupported = [r["unsupported"] for r in per_rank if "unsupported" in r]
        if unsupported:
            row.update(status="unsupported", detail=unsupported[0])
        else:
            numel = per_rank[0]["numel"]
            model = training_memory(numel, zero_stage=stage, dp=n, weight_bytes=4, grad_bytes=4, optimizer_bytes=8)
            counted = max(r["bytes_sent"] for r in per_rank)
            mem = per_rank[0]["memory"]  # rank 0; ranks differ only by padding or whole-parameter partitions
            row.update(status="ok", comm_bytes_measured=counted if counted or n == 1 else None,
                       comm_bytes_predicted=dp_step_comm_bytes(numel, stage, n, grad_bytes=4),
                       mem_params_bytes=mem["params"], mem_grads_bytes=mem["grads"],
                       mem_optimizer_bytes=mem["optimizer"], mem_params_predicted=model.weights,
                       mem_grads_predicted=model.gradients, mem_optimizer_predicted=model.optimizer,
                       **summarize([r["times"] for r in per_rank]))
        run_dir.append("benchmarks.csv", row)
        print(f"[{done}/{len(cases)}] zero {impl} stage {stage} dp={n}: {row['status']}", file=progress)
    return len(cases)
