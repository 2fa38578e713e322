"""The pipeline benchmark: step time per implementation x schedule x (p, m), and the bubble measured
from the reference runtime's per-action timestamps against the simulator's prediction with the
measured per-action costs.

Timestamps are time.perf_counter (CLOCK_MONOTONIC on Linux: one clock for every process of a host),
relative to a barrier before each step. Measured bubble = 1 - busy / (p * makespan), busy being the
summed F/B/I/W durations, makespan the last compute's end on any rank, of the timed step with the median
bubble (``median_step_timeline``); the prediction simulates the
same schedule with each kind's mean measured duration and the measured median hop latency between
ranks (``hop_latency``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from harness.records import registry
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.timing import median_interval, summarize
from reference.pipeline import GENERATORS, INTERLEAVED, placement, stages_per_rank

COMPUTE = ("F", "B", "I", "W")


@dataclass
class PipelineSweep:
    """What ``paritybench bench pipeline`` runs."""

    impls: list[str] = field(default_factory=lambda: ["reference", "torch"])
    schedules: list[str] = field(default_factory=lambda: list(GENERATORS))
    world_sizes: list[int] = field(default_factory=lambda: [2])
    """Pipeline ranks p. On 2 CPU cores only p = 2 is meaningful; p >= 4 is for GPU nodes."""
    microbatches: list[int] = field(default_factory=lambda: [2, 4, 8])
    wide_microbatches: list[int] | None = None
    """The microbatches at pipeline sizes above 2 (None: ``microbatches``): the main job on 2 cores runs p = 4 at
    m = 8 alone, for the activations each schedule holds (exact there too) and a step time."""
    virtual_stages: int = 2
    """Model chunks per rank for the interleaved schedules (the V-shaped ones hold two)."""
    hidden: int = 512
    layers_per_stage: int = 2
    rows_per_microbatch: int = 64
    iters: int = 5
    warmup: int = 2
    profile: str | None = None
    """A machine profile (``paritybench calibrate``): each row gets the step time and bubble it predicts."""


def bench_rank(impl_spec: str, schedule: str, p: int, m: int, v: int, hidden: int, layers_per_stage: int,
               rows: int, iters: int, warmup: int) -> dict:
    """Rank side: build this rank's stages in float32 and time ``iters`` training steps."""
    import time

    import torch
    import torch.distributed as dist

    from reference.pipeline.model import batch, build_layers, split_stages, sum_squared_error

    num_stages = p * v
    rank = dist.get_rank()
    stages = split_stages(build_layers(num_stages * layers_per_stage, hidden, 0, torch.float32), num_stages)
    from harness.runtime.world import rank_device

    device = rank_device()
    place = placement(schedule, p, v)
    mine = {s: stages[s].to(device) for s in range(num_stages) if place[s] == rank}
    try:
        trainer = registry.load(impl_spec, "pipeline").build(
            mine, num_stages, schedule, m, v, sum_squared_error, rows * m, (hidden,))
    except NotImplementedError as exc:
        return {"unsupported": str(exc)}
    x, y = (t.to(device) / hidden for t in batch(rows * m, hidden, 0, torch.float32))  # far from overflow
    times, steps, held = [], [], []
    for it in range(warmup + iters):
        for mod in mine.values():
            mod.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        trainer.step(x if 0 in mine else None, y if num_stages - 1 in mine else None)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
            steps.append(getattr(trainer, "events", None))
            held.append(getattr(trainer, "peak_held", None))
    return {"times": times, "steps": steps, "peak_held": held}


def median_step_timeline(per_rank_steps):
    """Of every timed step, the one with the median measured bubble (a single step's bubble on a shared CPU
    moves by tens of percent from one step to the next; the median step is what the row reports)."""
    timelines = [measured_timeline(list(step)) for step in zip(*per_rank_steps, strict=True)]
    return sorted(timelines, key=lambda t: t.bubble_fraction)[(len(timelines) - 1) // 2]


def measured_timeline(per_rank_events):
    """One step's events (per rank) as a Timeline (compute actions only), with its measured bubble."""
    from reference.pipeline import Action, Timeline

    rows = [[(Action.parse(a), s, e) for a, s, e in events if Action.parse(a).kind in COMPUTE]
            for events in per_rank_events]
    makespan = max((e for row in rows for _, _, e in row), default=0.0)
    busy = sum(e - s for row in rows for _, s, e in row)
    bubble = 1 - busy / (len(rows) * makespan) if makespan > 0 else 0.0
    return Timeline(rows, makespan, bubble, [], [])


def hop_latency(measured, p: int) -> float:
    """Median cross-rank hop, measured: consumer start - producer end, over the edges where the
    consumer's rank was already idle when the producer finished (so the gap is the transfer alone)."""
    ends = {(a.stage, a.kind, a.microbatch): e for row in measured.events for a, _, e in row}
    gaps = []
    for row in measured.events:
        prev_end = 0.0
        for a, start, end in row:
            src = None
            if a.kind == "F" and a.stage > 0:
                src = (a.stage - 1, "F", a.microbatch)
            elif a.kind in ("B", "I"):
                nxt = [(a.stage + 1, k, a.microbatch) for k in ("B", "I")]
                src = next((key for key in nxt if key in ends), None)
            if src and src in ends and (src[0] % p) != (a.stage % p) and prev_end <= ends[src]:
                gaps.append(start - ends[src])
            prev_end = end
    return statistics.median(gaps) if gaps else 0.0


UNIT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0, "comm": 0.0}
"""The textbook costs (backward = 2 forward, split evenly into I and W): the bubble they give depends on the
schedule alone, so it is a deterministic figure the gate compares exactly (``bubble_simulated``)."""


def unit_cost_timeline(schedule: str, p: int, m: int, v: int):
    """None where our generator has no such schedule (e.g. interleaved with m not in whole rounds)."""
    from reference.pipeline import generate, simulate

    try:
        return simulate(generate(schedule, p, m, v), UNIT_COSTS)
    except ValueError:
        return None


def unit_cost_bubble(schedule: str, p: int, m: int, v: int) -> float | None:
    timeline = unit_cost_timeline(schedule, p, m, v)
    return None if timeline is None else timeline.bubble_fraction


def predicted_timeline(schedule: str, p: int, m: int, v: int, measured):
    """Simulate the schedule with each kind's mean measured duration and the measured hop latency."""
    from reference.pipeline import generate, simulate

    durations: dict[str, list[float]] = {}
    for row in measured.events:
        for a, s, e in row:
            durations.setdefault(a.kind, []).append(e - s)
    costs = {k: statistics.fmean(d) for k, d in durations.items()}
    sched = generate(schedule, p, m, v)
    return simulate(sched, {**costs, "comm": max(0.0, hop_latency(measured, p))})


def run_sweep(cfg: PipelineSweep, get_world, run_dir, progress=STDERR) -> int:
    """Append one benchmark row per case; draw measured and simulated Gantt charts for ours."""
    from harness.cost_model.predict import load_profile, mlp_workload, planned_columns, predict_step
    from reference.pipeline.draw import gantt_png

    profile = load_profile(cfg.profile)
    cases = [(p, impl, schedule, m) for p in cfg.world_sizes for impl in cfg.impls for schedule in cfg.schedules
             for m in (cfg.microbatches if p <= 2 or cfg.wide_microbatches is None else cfg.wide_microbatches)]
    for done, (p, impl, schedule, m) in enumerate(cases, 1):
        v = cfg.virtual_stages if schedule in INTERLEAVED else stages_per_rank(schedule)
        world = get_world(p)
        per_rank = call_case(world, bench_rank, impl, schedule, p, m, v, cfg.hidden, cfg.layers_per_stage,
                             cfg.rows_per_microbatch, cfg.iters, cfg.warmup)
        row = {"suite": "pipeline", "op": schedule, "impl": impl, "backend": world.backend, "world_size": p,
               "dtype": "float32", "microbatches": m, "virtual_stages": v, "iters": cfg.iters,
               "warmup": cfg.warmup, "count": cfg.rows_per_microbatch * m,
               "bubble_simulated": unit_cost_bubble(schedule, p, m, v)}
        unit = unit_cost_timeline(schedule, p, m, v)
        if unit is not None:  # stage activations held at once, most over ranks (the order fixes it, not the costs)
            row["peak_activations_simulated"] = max(unit.peak_in_flight)
        if profile is not None and row["bubble_simulated"] is not None:
            work = mlp_workload(p * v * cfg.layers_per_stage, cfg.hidden, cfg.rows_per_microbatch)
            row.update(planned_columns(predict_step(profile, work, 1, p, 1, 0, schedule, m)))
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            row.update(status="ok", **summarize([r["times"] for r in per_rank]))
            held = [h for r in per_rank for h in r["peak_held"] if h is not None]
            if held:
                row["peak_activations_measured"] = max(held)
            if all(r["steps"] and all(r["steps"]) for r in per_rank):
                measured = median_step_timeline([r["steps"] for r in per_rank])
                predicted = predicted_timeline(schedule, p, m, v, measured)
                # the step-to-step spread of the bubble: the interval the planner's bubble is judged within
                lo, hi, _ = median_interval([measured_timeline(list(step)).bubble_fraction
                                             for step in zip(*[r["steps"] for r in per_rank], strict=True)])
                row.update(bubble_measured=measured.bubble_fraction, bubble_predicted=predicted.bubble_fraction,
                           makespan_predicted_us=predicted.makespan * 1e6, bubble_ci_lo=lo, bubble_ci_hi=hi)
                stem = f"pipeline_{impl}_{schedule}_p{p}_m{m}"
                gantt_png(measured, run_dir.path / f"{stem}_measured.png",
                          f"{schedule} p={p} m={m}, measured: bubble {measured.bubble_fraction:.3f}")
                gantt_png(predicted, run_dir.path / f"{stem}_simulated.png",
                          f"{schedule} p={p} m={m}, simulated with measured costs: "
                          f"bubble {predicted.bubble_fraction:.3f}")
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = (f" step p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else f" {row['status']}")
            if "bubble_measured" in row:
                extra += f", bubble measured {row['bubble_measured']:.3f} vs predicted {row['bubble_predicted']:.3f}"
            print(f"[{done}/{len(cases)}] pipeline p={p} {impl} {schedule} m={m}:{extra}", file=progress, flush=True)
    return len(cases)
