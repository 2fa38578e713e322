"""The data-parallel / ZeRO benchmark: step time and per-rank memory of model state per implementation x
stage x DP size, next to ``cost_model.training_memory``; bytes sent per step, counted where the
implementation calls torch.distributed's collectives (ours; DDP's C++ reducer and FSDP2's functional
collectives are not seen: blank), next to ``cost_model.dp_step_comm_bytes`` (2 Psi, or 3 Psi for ZeRO-3).

The model is one transformer block (reference.models.TransformerBlock) in float32 trained with Adam:
K = 8 bytes of optimizer state per parameter, 4-byte weights and gradients.

Variants (``ZeroSweep.variants``), at every stage and DP size: ``bf16`` — the reference's mixed precision
(``reference.mixed_precision.MixedPrecisionZero``: bf16 block, fp32 master and Adam state, gradients
reduced in fp32; the ZeRO paper's 2 + 2 + 12 bytes; row dtype "bfloat16"); ``clip`` — every
implementation with global-norm clipping at 1.0 (``StepRecipe``; row op "stage<k>+clip"); ``hybrid`` — at the
largest N, stages 1-3, hybrid sharding over a 2 x N/2 mesh (the zero contract's ``replicate``; row op
"stage<k>+hybrid<R>x<S>"): the bytes of the across-replicas all-reduce apart (``comm_bytes_replicate``) from the
shard group's reduce-scatter and gathers, each against ``cost_model.hsdp_step_comm_bytes``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.comm_count import counted_collectives
from harness.runtime.timing import summarize, time_iterations
from reference.cost_model import dp_step_comm_bytes, hsdp_step_comm_bytes, training_memory
from reference.zero.accounting import held_bytes


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
    """Untimed steps before the timed ones, counting the first (the optimizer state's) and the counted one."""
    variants: list[str] = field(default_factory=lambda: ["plain", "bf16", "clip", "hybrid"])
    """"plain"; "bf16": the reference in mixed precision; "clip": every implementation clipping at 1.0; "hybrid":
    every implementation over a 2 x N/2 hybrid mesh."""


VARIANTS = ("plain", "bf16", "clip", "hybrid")
REPLICAS = 2
"""The hybrid variant's replicas: a (2, N/2) mesh — (2, 1) at N = 2, (2, 2) at N = 4."""


def bench_rank(impl_spec: str, stage: int, hidden: int, seq: int, batch: int, iters: int, warmup: int,
               variant: str = "plain") -> dict:
    import torch

    from harness.runtime.world import rank_device
    from reference.models import TransformerBlock
    from reference.zero import OptimizerSpec, StepRecipe

    device = rank_device()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if variant == "bf16" else torch.float32
    model = TransformerBlock(hidden, max(1, hidden // 64), 4 * hidden, dtype=dtype).to(device)
    numel = sum(p.numel() for p in model.parameters())
    try:
        if variant == "bf16":
            trainer = _MixedTrainer(model, OptimizerSpec("adam", 1e-4), stage)
        else:
            kwargs = ({"recipe": StepRecipe(max_grad_norm=1.0)} if variant == "clip" else
                      {"replicate": REPLICAS} if variant == "hybrid" else {})
            trainer = registry.load(impl_spec, "zero").build(model, OptimizerSpec("adam", 1e-4), stage, None,
                                                             **kwargs)
    except (NotImplementedError, ValueError, TypeError) as exc:
        return {"unsupported": str(exc)}
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype)
    y = torch.randn(batch, seq, hidden, device=device, dtype=dtype)

    def step():
        trainer.step(x, y)

    step()  # the optimizer state exists from the first step on
    counter, by_op = [0.0], {}
    with counted_collectives(counter, by_op):
        step()
    # those two untimed steps are warm-up steps too: ``warmup`` counts them
    return {"times": time_iterations(step, iters, max(0, warmup - 2), device), "bytes_sent": counter[0],
            "by_op": by_op, "memory": trainer.memory(), "numel": numel}


class _MixedTrainer:
    """The reference's mixed precision behind the bench's ``step`` / ``memory``."""

    def __init__(self, model, spec, stage: int):
        from reference.mixed_precision import MixedPrecisionZero

        self.model, self.engine = model, MixedPrecisionZero(model, spec, stage)

    def step(self, x, y) -> None:
        import torch.nn.functional as F

        self.engine.zero_grad()
        F.mse_loss(self.model(x), y).backward()
        self.engine.reduce()
        self.grads = held_bytes(self.engine.held_grads())
        self.engine.update()

    def memory(self) -> dict:
        from reference.zero.accounting import optimizer_state_tensors

        e = self.engine
        return {"params": held_bytes(list(self.model.parameters()) + e.parts), "grads": self.grads,
                "optimizer": held_bytes(e.masters + optimizer_state_tensors(e.optimizer))}


def _mixed_comm_bytes(numel: int, stage: int, n: int) -> float:
    """The reference's mixed precision per rank per step: gradients reduced in fp32 (4 bytes: an all-reduce,
    2 ring passes, at stage 0; a reduce-scatter, 1, from stage 1), parameters all-gathered in bf16 (2 bytes:
    once at stages 1-2, forward and backward at stage 3) — cost_model.dp_step_comm_bytes' ring passes with
    each pass's own element size."""
    passes = (n - 1) / n * numel
    return passes * (2 * 4 if stage == 0 else 4 + 2 * (2 if stage == 3 else 1))


def _cases(cfg: ZeroSweep) -> list[tuple[int, str, int, str]]:
    """(N, impl, stage, variant): plain for every implementation; bf16 for the reference; clip for every
    implementation at the largest N."""
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants must be among {', '.join(VARIANTS)}; got {', '.join(unknown)}.")
    out = []
    for n, impl, stage, variant in itertools.product(cfg.world_sizes, cfg.impls, cfg.stages, cfg.variants):
        if not registry.resolve(impl, "zero").owns(f"stage{stage}"):  # reference-naive: stage 0 only
            continue
        if (variant == "bf16" and impl != "reference") or (variant in ("clip", "hybrid") and n != max(cfg.world_sizes)):
            continue
        if variant == "hybrid" and (stage == 0 or n % REPLICAS):  # ZeRO 0 replicates already
            continue
        out.append((n, impl, stage, variant))
    return out


def run_sweep(cfg: ZeroSweep, get_world, run_dir, progress=STDERR) -> int:
    cases = _cases(cfg)
    for done, (n, impl, stage, variant) in enumerate(cases, 1):
        world = get_world(n)
        per_rank = call_case(world, bench_rank, impl, stage, cfg.hidden, cfg.seq, cfg.batch, cfg.iters, cfg.warmup,
                             variant)
        suffix = {"clip": "+clip", "hybrid": f"+hybrid{REPLICAS}x{n // REPLICAS}"}.get(variant, "")
        row = {"suite": "zero", "op": f"stage{stage}{suffix}", "zero_stage": stage,
               "impl": impl, "backend": world.backend, "world_size": n,
               "dtype": "bfloat16" if variant == "bf16" else "float32", "iters": cfg.iters, "warmup": cfg.warmup,
               "count": cfg.batch * cfg.seq}
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            numel = per_rank[0]["numel"]
            shards = n // REPLICAS if variant == "hybrid" else n  # hybrid: the state sharded over the shard group
            model = (training_memory(numel, zero_stage=stage, dp=n) if variant == "bf16" else  # 2 + 2 + 12
                     training_memory(numel, zero_stage=stage, dp=shards, weight_bytes=4, grad_bytes=4,
                                     optimizer_bytes=8))
            counted = max(r["bytes_sent"] for r in per_rank)
            mem = per_rank[0]["memory"]  # rank 0; ranks differ only by padding or whole-parameter partitions
            predicted = (_mixed_comm_bytes(numel, stage, n) if variant == "bf16"
                         else dp_step_comm_bytes(numel, stage, n, grad_bytes=4))
            if variant == "hybrid":  # the two reductions apart: the replicas' all-reduce, the shard group's rest
                hybrid = hsdp_step_comm_bytes(numel, stage, REPLICAS, n // REPLICAS, grad_bytes=4)
                across = max(r["by_op"].get("all_reduce", 0.0) for r in per_rank)
                predicted = hybrid["total"]
                row.update(comm_bytes_replicate=across if counted else None,
                           comm_bytes_replicate_predicted=hybrid["replicate"])
            row.update(status="ok", comm_bytes_measured=counted if counted or n == 1 else None,
                       comm_bytes_predicted=predicted,
                       mem_params_bytes=mem["params"], mem_grads_bytes=mem["grads"],
                       mem_optimizer_bytes=mem["optimizer"], mem_params_predicted=model.weights,
                       mem_grads_predicted=model.gradients, mem_optimizer_predicted=model.optimizer,
                       **summarize([r["times"] for r in per_rank]))
        run_dir.append("benchmarks.csv", row)
        print(f"[{done}/{len(cases)}] zero {impl} stage {stage} dp={n} {variant}: {row['status']}", file=progress)
    return len(cases)
