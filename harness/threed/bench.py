"""The 3D benchmark: every (dp, pp, tp) layout of one world size (8 by default) training the same GPT
with the reference composition — step time, model-state memory per rank (measured from live tensors,
the largest rank), and the pipeline bubble measured from the runtime's per-action timestamps (the median
over the timed steps) — beside
``paritybench plan``'s prediction for the same layout (``harness.cost_model.plan.estimate``: its 1F1B bubble and
communication; model-state bytes from ``training_memory`` in this run's float32 / SGD-momentum terms).

Variants (``ThreeDSweep.variants``, opt-in beyond ``plain``): ``bf16`` — the GPT in bfloat16 with fp32
masters and the DP reduction in bfloat16 too (``reference.stack.compose`` mixed precision; model state against
``training_memory`` with 2-byte weights and gradients and K = 8: the fp32 master + SGD's fp32 momentum;
every message — TP activations, pipeline sends, DP gradients — in 2 bytes, the terms ``plan`` counts
``comm_bytes_predicted`` in); ``clip`` — global gradient-norm
clipping at 1.0 (``reference.clipping``: one all-reduce over tp, pp and dp more per step). Rows: ``op``
``<dp>x<pp>x<tp>`` with ``dtype`` bfloat16, or ``<dp>x<pp>x<tp>+clip``.

Timing: every layout is timed in ``iters`` interleaved rounds — round 1 steps every layout once, then
round 2, ... (each rank keeps its trainers between rounds; the first round warms each up) — so that a
drift of the machine (another job, a thermal step) lands on every layout alike rather than on the ones
that happened to run late. Every round's step is kept (``samples_us``, the max over ranks); a row carries
their median and its distribution-free confidence interval (``harness.runtime.timing.median_interval``).

A layout that raises, dies or hangs, in any round, is a row with status ``failed`` and its verdict line
(``harness.runtime.bench_case``: the other layouts go on, on a respawned World, their trainers rebuilt and warmed
up again). On 2 CPU cores 8 ranks are oversubscribed: compare layouts with each other, not with a machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from harness.runtime.bench_case import STDERR, call_case, declined
from harness.stack.bench import LayoutSweep, valid_layouts

_GROUPS: dict = {}  # the process groups of each layout, created once per rank process
_TRAINERS: dict = {}  # (sweep, layout, variant) -> this rank's trainer and batch, kept between rounds


@dataclass
class ThreeDSweep(LayoutSweep):
    zero_stage: int = 1
    variants: list = field(default_factory=lambda: ["plain"])
    """plain, bf16, clip (see the module's docstring)."""


VARIANTS = ("plain", "bf16", "clip")


def release_rank() -> None:
    """Rank side: drop the trainers kept between rounds."""
    _TRAINERS.clear()


def bench_rank(cfg: ThreeDSweep, dims_t: tuple[int, int, int], variant: str = "plain", steps: int | None = None,
               warmup: int | None = None) -> dict:
    """Rank side: ``warmup`` untimed and ``steps`` timed steps of the layout's trainer (built on the first
    call of a sweep, kept for its later rounds); defaults: the sweep's own."""
    import torch.distributed as dist

    from reference.pipeline.schedule import Action
    from reference.zero import held_bytes
    from reference.zero.accounting import optimizer_state_tensors

    key = (repr(cfg), tuple(dims_t), variant)
    steps = cfg.iters if steps is None else steps
    warmup = cfg.warmup if warmup is None else warmup
    if key not in _TRAINERS:  # built in this call: warmed up as in the first round, whatever the round (a World
        # respawned after a failed layout rebuilds the others in a later round)
        _TRAINERS[key] = _build(cfg, dims_t, variant)
        warmup = max(warmup, cfg.warmup)
    trainer, tokens, targets, numel = _TRAINERS[key]
    times, busy, makespan = [], [], []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        trainer.step(tokens, targets)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            events = trainer.last_events
            busy.append(sum(end - begin for name, begin, end in events if Action.parse(name).kind in "FBIW"))
            makespan.append(max((end for _, _, end in events), default=0.0))
    params = list(trainer.local.parameters())
    if trainer.mixed:  # fp32 masters count as optimizer state (the ZeRO paper's K)
        grads, state = trainer.sync.held_grads(), trainer.sync.masters
    else:
        grads, state = [p.grad for p in params] + ([trainer.sync.master.grad] if cfg.zero_stage else []), []
    return {"times": times, "numel": numel, "microbatches": trainer.schedule.num_microbatches,
            "memory": {"params": held_bytes(params), "grads": held_bytes(grads),
                       "optimizer": held_bytes(state + optimizer_state_tensors(trainer.optimizer))},
            "busy": busy, "makespan": makespan}


def _build(cfg: ThreeDSweep, dims_t: tuple[int, int, int], variant: str):
    import torch
    import torch.distributed as dist

    from reference.models import GPT
    from reference.stack.compose import parallelize
    from reference.stack.topology import ParallelDims, build_groups
    from reference.zero import OptimizerSpec

    dims = ParallelDims(*dims_t)
    if dims not in _GROUPS:
        _GROUPS[dims] = build_groups(dims, dist.get_rank())
    torch.manual_seed(0)
    model = GPT(cfg.vocab, cfg.hidden, cfg.heads, cfg.ffn, cfg.layers,
                dtype=torch.bfloat16 if variant == "bf16" else torch.float32)
    numel = sum(p.numel() for p in model.parameters())
    trainer = parallelize(model, dims, cfg.schedule, cfg.zero_stage, cfg.checkpointing, groups=_GROUPS[dims],
                          optimizer=OptimizerSpec("sgd", 1e-3), max_grad_norm=1.0 if variant == "clip" else None,
                          reduce_dtype=torch.bfloat16 if variant == "bf16" else None)  # 2-byte messages: plan's
    m = trainer.schedule.num_microbatches
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (dims.dp * m * cfg.rows, cfg.seq), generator=gen)
    targets = torch.randint(0, cfg.vocab, tokens.shape, generator=gen)
    return trainer, tokens, targets, numel


def run_sweep(cfg: ThreeDSweep, get_world, run_dir, progress=STDERR) -> int:
    from harness.cost_model.plan import Layout, Model, estimate
    from harness.cost_model.predict import gpt_workload, load_profile, planned_columns, predict_step
    from harness.runtime.timing import median_interval, summarize
    from reference.cost_model import training_memory

    profile = load_profile(cfg.profile)
    work = gpt_workload(cfg.vocab, cfg.hidden, cfg.heads, cfg.ffn, cfg.layers, cfg.seq, cfg.rows)
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown or not cfg.variants:
        raise ValueError(f"variants must be among {', '.join(VARIANTS)}; got {', '.join(unknown) or 'none'}.")
    cases = [(dims, v) for dims in (cfg.layouts or valid_layouts(cfg)) for v in cfg.variants]
    world = get_world(cfg.world_size)
    kept: dict = {}  # case -> every round's per-rank results
    for round_ in range(cfg.iters):
        for done, case in enumerate(cases, 1):
            if round_ and declined(kept[case][-1]):  # failed: not asked again
                continue
            per_rank = call_case(world, bench_rank, cfg, *case, 1, cfg.warmup if round_ == 0 else 0)
            kept.setdefault(case, []).append(per_rank)
            said = declined(per_rank)
            what = said["status"] if said else f"{max(r['times'][0] for r in per_rank) * 1e3:.1f} ms"
            print(f"[round {round_ + 1}/{cfg.iters}, {done}/{len(cases)}] 3d {'x'.join(map(str, case[0]))} {case[1]}: "
                  f"{what}", file=progress)
    world.run(release_rank, timeout=60)
    for dims, variant in cases:
        dp, pp, tp = dims
        rounds = kept[(dims, variant)]
        said = declined(rounds[-1])
        if said:
            run_dir.append("benchmarks.csv", {**_case_columns(cfg, dims, variant, world.backend), **said})
            print(f"3d dp={dp} pp={pp} tp={tp} {variant}: {said['status']}: {said['detail']}", file=progress)
            continue
        per_rank = [{k: [x for rnd in rounds for x in rnd[rank][k]] if k in ("times", "busy", "makespan")
                     else rounds[-1][rank][k] for k in rounds[-1][rank]} for rank in range(cfg.world_size)]
        r0 = per_rank[0]
        low = variant == "bf16"  # bf16 weights and gradients; fp32 master + momentum: K = 8
        states = training_memory(r0["numel"], zero_stage=cfg.zero_stage, dp=dp, tp=tp, pp=pp,
                                 weight_bytes=2 if low else 4, grad_bytes=2 if low else 4,
                                 optimizer_bytes=8 if low else 4)
        plan = estimate(Model(r0["numel"], cfg.seq, cfg.rows, cfg.hidden, cfg.heads, cfg.layers,
                              r0["microbatches"]), Layout(dp=dp, tp=tp, pp=pp, zero=cfg.zero_stage)) \
            if cfg.layers % pp == 0 else None
        worst = max(per_rank, key=lambda r: sum(r["memory"].values()))["memory"]
        # per timed step over every rank, then the median step (one step's bubble is noisy on a shared CPU)
        bubble = statistics.median(1 - sum(r["busy"][i] for r in per_rank) / sum(r["makespan"][i] for r in per_rank)
                                   for i in range(len(r0["busy"])))
        row = {**_case_columns(cfg, dims, variant, world.backend),
               "count": r0["numel"], "microbatches": r0["microbatches"], "status": "ok",
               "mem_params_bytes": worst["params"], "mem_grads_bytes": worst["grads"],
               "mem_optimizer_bytes": worst["optimizer"], "mem_params_predicted": states.weights,
               "mem_grads_predicted": states.gradients, "mem_optimizer_predicted": states.optimizer,
               "bubble_measured": bubble, "bubble_predicted": plan["bubble_fraction_1f1b"] if plan else None,
               "comm_bytes_predicted": plan["comm_bytes_per_step"]["total"] if plan else None,
               **summarize([r["times"] for r in per_rank])}
        lo, hi, level = median_interval(row["samples_us"])
        row.update(rounds=cfg.iters, time_ci_lo_us=lo, time_ci_hi_us=hi, time_ci_level=level)
        if profile is not None and variant == "plain":  # the profile predicts the float32 step
            row.update(planned_columns(predict_step(profile, work, dp, pp, tp, cfg.zero_stage, cfg.schedule,
                                                    r0["microbatches"], recompute=cfg.checkpointing)))
        run_dir.append("benchmarks.csv", row)
        planned = f" (planned {row['time_planned_us'] / 1e3:.1f} ms)" if "time_planned_us" in row else ""
        print(f"3d dp={dp} pp={pp} tp={tp} {variant}: median {row['time_p50_us'] / 1e3:.1f} ms over {cfg.iters} "
              f"rounds, [{lo / 1e3:.1f}, {hi / 1e3:.1f}] at {level:.0%}{planned}", file=progress)
    return len(cases)


def _case_columns(cfg: ThreeDSweep, dims: tuple[int, int, int], variant: str, backend: str) -> dict:
    """What names a layout's row (and its recipe in ``detail``), measured or not."""
    dp, pp, tp = dims
    return {"suite": "3d", "op": f"{dp}x{pp}x{tp}" + ("+clip" if variant == "clip" else ""), "impl": "reference",
            "backend": backend, "world_size": cfg.world_size, "dtype": "bfloat16" if variant == "bf16" else "float32",
            "iters": cfg.iters, "warmup": cfg.warmup, "zero_stage": cfg.zero_stage,
            "detail": f"{cfg.schedule}, zero {cfg.zero_stage}, checkpointing {cfg.checkpointing}"}
