"""``paritybench bench stack``: every dp x pp x tp layout of one world size (8 by default), for each stack
(``--impls``; default every registered one that runs here: ours and torch's) and family (GPT, Llama with
grouped-query attention), trained through the stack contract — so a user's stack is measured exactly as it
is held to one device. Per (stack, family, layout) one row, suite ``stack``, ``op`` = ``<family>/<dp>x<pp>x<tp>``:

- step time: every case timed in ``iters`` interleaved rounds (round 1 steps every case once, then round 2,
  ...; each rank keeps its trainers between rounds, the first round warms each up), so a drift of the
  machine lands on every case alike; the median over rounds of the max over ranks, with its distribution-
  free confidence interval (``harness.runtime.timing.median_interval``); ``tokens_per_s`` = the global batch's
  tokens / that median;
- model state per rank: the largest rank's parameters, gradients and optimizer state, measured from its
  live tensors (the trainer's optional ``memory()``; blank without it), beside ``training_memory`` for the
  layout (float32, SGD momentum: K = 4; an even split over tp x pp);
- bytes per step: the busiest rank's, counted over one more (untimed) step (``comm_count.counted_traffic``:
  Python and functional collectives, point-to-point sends), beside the planner's terms at 4-byte elements:
  the DP sync (2 Psi / (tp pp), 3 at ZeRO 3), 4 TP all-reduces of the activations per layer and
  microbatch, and a middle stage's activations forward and gradients back (at pp = 2, one way) — the
  embedding, the head's vocabulary-parallel cross-entropy, the loss and the norm are not in the plan: the
  gap shows them (measured here: exactly the plan + the loss's all-reduce for ours at dp or pp alone, + the
  per-parameter padding for FSDP2);
- the bubble: measured where the trainer reports its pipeline's action times (``pipeline_events()``:
  ours), beside plan's 1F1B bubble; with a machine profile (``--profile``, or the calibration ``bench
  all`` runs first) the step time the planner predicts, with its parts.

A case a stack does not provide is a row with status ``unsupported`` and its one sentence; a case it raises, dies or
hangs in, in any round, a row with status ``failed`` and its verdict line (``harness.runtime.bench_case``: the other
cases go on, on a respawned World, their trainers rebuilt and warmed up again). On 2 CPU
cores 8 ranks are oversubscribed: compare layouts and stacks with each other, not with a machine.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from harness.runtime.bench_case import STDERR, call_case, declined

_TRAINERS: dict = {}  # (sweep, impl, family, layout) -> this rank's trainer and batch (or the refusal)


@dataclass
class LayoutSweep:
    """What a sweep over every dp x pp x tp layout of one world size shares (``bench stack``, ``bench 3d``)."""

    world_size: int = 8
    """Ranks; every layout dp x pp x tp of it that the model allows runs."""
    schedule: str = "1f1b"
    checkpointing: bool = False
    vocab: int = 512
    hidden: int = 128
    heads: int = 8
    ffn: int = 512
    layers: int = 8
    seq: int = 64
    rows: int = 2
    """Samples per microbatch; microbatches per step = 2 pp (per replica)."""
    iters: int = 3
    """Interleaved rounds, one timed step of every case each."""
    warmup: int = 1
    """Untimed steps of each case in the first round."""
    layouts: list = field(default_factory=list)
    """(dp, pp, tp) to run; empty: all valid ones."""
    profile: str | None = None
    """A machine profile (``paritybench calibrate``): each row gets the step time it predicts, with its parts."""

    @property
    def world_sizes(self) -> list[int]:
        return [self.world_size]


@dataclass
class StackSweep(LayoutSweep):
    impls: list = field(default_factory=lambda: ["reference", "torch"])
    families: list = field(default_factory=lambda: ["gpt", "llama"])
    zero_stage: int = 2
    """2: what ours and torch's shard over dp (FSDP2's ZeRO 2); megatron-core's and DeepSpeed's pipeline shard 1."""
    optimizer: str = "sgd"
    """"sgd" (momentum) or "adam" — Adam is the one every stack here trains (torchtitan's are Adam only); a sweep
    of another optimizer labels its rows' family ``<family>-adam-zero<stage>`` (its own cases for the gate)."""
    kv_heads: int = 4
    """The Llama's KV heads (at tp 8 each is replicated twice: ours sums the replicas, torch refuses)."""


FAMILIES = ("gpt", "llama")


def valid_layouts(cfg) -> list[tuple[int, int, int]]:
    """Every dp x pp x tp of ``cfg.world_size`` that the model (``cfg.heads``, ``cfg.layers``) allows under
    ``cfg.schedule`` (the 3D bench's sweep uses the same rule)."""
    n = cfg.world_size
    return [(dp, pp, n // (dp * pp)) for dp in range(1, n + 1) for pp in range(1, n + 1)
            if n % (dp * pp) == 0 and cfg.heads % (n // (dp * pp)) == 0 and pp <= cfg.layers
            and (cfg.schedule != "interleaved" or 2 * pp <= cfg.layers)]


def family_label(cfg: StackSweep, family: str) -> str:
    """The family as a row's op names it: the default sweep's plain, another optimizer's with its recipe."""
    return family if cfg.optimizer == "sgd" else f"{family}-{cfg.optimizer}-zero{cfg.zero_stage}"


THIRD_PARTY = (("megatron", 1), ("deepspeed", 1), ("torchtitan", 2))
"""(stack, the ZeRO stage it shards with) of the third parties ``bench all`` measures beside ours, Adam: megatron-
core's distributed optimizer and DeepSpeed's pipeline engine shard optimizer state (1), torchtitan FSDP2 (2)."""
THIRD_PARTY_LAYOUTS = [(8, 1, 1), (4, 2, 1), (2, 2, 2), (2, 1, 4)]


def third_party_sweeps(cfg: StackSweep, installed: list[str]) -> list[StackSweep]:
    """``bench all``'s sweeps of the installed third-party stacks beside ours: per ZeRO stage one Adam sweep of
    the Llama over four layouts of ``cfg.world_size`` ranks (every dimension; one row per micro-batch, which
    torchtitan's pipeline takes), ours at the same stage — what the side-by-side compares."""
    from dataclasses import replace

    out = []
    for stage in sorted({z for _, z in THIRD_PARTY}):
        impls = [name for name, z in THIRD_PARTY if z == stage and name in installed]
        layouts = [d for d in THIRD_PARTY_LAYOUTS if d in valid_layouts(cfg)]
        if impls and layouts:
            out.append(replace(cfg, impls=["reference", *impls], families=["llama"], optimizer="adam",
                               zero_stage=stage, rows=1, layouts=layouts))
    return out


def spec_of(cfg: StackSweep, family: str):
    from reference.models import ModelSpec

    return ModelSpec(family, vocab=cfg.vocab, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                     kv_heads=cfg.kv_heads if family == "llama" else None, ffn=cfg.ffn, dtype="float32")


def release_rank() -> None:
    """Rank side: drop the trainers kept between rounds."""
    _TRAINERS.clear()


def bench_rank(cfg: StackSweep, impl: str, family: str, dims: tuple[int, int, int], warmup: int,
               count: bool = False) -> dict:
    """Rank side: ``warmup`` untimed steps and one timed step of the case's trainer (built on the first call
    of a sweep, kept for its later rounds); ``count``: then one more step with its bytes counted, and the
    rank's model state. {"unsupported": sentence} where the stack does not provide the case."""
    import torch.distributed as dist

    from harness.runtime.comm_count import counted_traffic
    from harness.runtime.rank import rank_device

    key = (repr(cfg), impl, family, tuple(dims))
    if key not in _TRAINERS:  # built in this call: warmed up as in the first round, whatever the round (a World
        # respawned after a failed case rebuilds the other cases' trainers in a later round)
        _TRAINERS[key] = _build(cfg, impl, family, dims)
        warmup = max(warmup, cfg.warmup)
    built = _TRAINERS[key]
    if isinstance(built, str):
        return {"unsupported": built}
    trainer, tokens, targets = built
    tokens, targets = tokens.to(rank_device()), targets.to(rank_device())
    for i in range(warmup):
        try:
            trainer.step(tokens, targets)
        except (NotImplementedError, ValueError) as exc:  # a batch the stack refuses (one sentence, every rank)
            if i:
                raise
            _TRAINERS[key] = str(exc).splitlines()[0]
            return {"unsupported": _TRAINERS[key]}
    if hasattr(trainer, "activate"):  # a stack with process-global parallel state (megatron-core): this case's
        trainer.activate()
    dist.barrier()
    start = time.perf_counter()
    trainer.step(tokens, targets)
    out = {"time": time.perf_counter() - start, "unsupported": None}
    events = trainer.pipeline_events() if hasattr(trainer, "pipeline_events") else None
    if events:
        from reference.pipeline.schedule import Action

        out["busy"] = sum(end - begin for name, begin, end in events if Action.parse(name).kind in "FBIW")
        out["makespan"] = max((end for _, _, end in events), default=0.0)
    if count:
        sent = [0.0]
        with counted_traffic(sent):
            trainer.step(tokens, targets)
        out["sent"] = sent[0]
        out["memory"] = trainer.memory() if hasattr(trainer, "memory") else None
    return out


def _build(cfg: StackSweep, impl: str, family: str, dims):
    import torch

    from harness.records import registry
    from reference.zero import OptimizerSpec

    from ..contracts.stack import Layout, Recipe

    spec, (dp, pp, tp) = spec_of(cfg, family), dims
    layout = Layout(dp, pp, tp, zero=cfg.zero_stage, schedule=cfg.schedule, checkpointing=cfg.checkpointing)
    try:
        # AdamW as its users set it: torch's weight decay 0.1, the biases and norms spared
        decay = {"weight_decay": 0.1, "decay": "matrices"} if cfg.optimizer == "adamw" else {}
        trainer = registry.load(impl, "stack").build(spec, layout,
                                                     Recipe(optimizer=OptimizerSpec(cfg.optimizer, 1e-3, **decay)))
        trainer.load_dense(spec.build(0).state_dict())
    except (NotImplementedError, ValueError) as exc:
        return str(exc).splitlines()[0]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (dp * layout.num_microbatches * cfg.rows, cfg.seq), generator=gen)
    return trainer, tokens, torch.randint(0, cfg.vocab, tokens.shape, generator=gen)


def predicted_bytes(cfg: StackSweep, numel: int, dp: int, pp: int, tp: int, microbatches: int) -> float:
    """The planner's bytes per step for the busiest rank, at 4-byte elements (see the module's docstring)."""
    from reference.cost_model import dp_step_comm_bytes, tp_layer_comm_bytes

    layers = math.ceil(cfg.layers / pp)  # the largest stage
    sync = dp_step_comm_bytes(numel / (tp * pp), cfg.zero_stage, dp, grad_bytes=4)
    tensor = tp_layer_comm_bytes(cfg.rows, cfg.seq, cfg.hidden, tp, activation_bytes=4) * layers * microbatches
    # a middle stage sends activations forward and gradients back; at pp = 2 there is none, and each rank
    # sends one way only (``plan.estimate`` counts both ways at every pp > 1)
    pipe = (2 if pp > 2 else 1) * cfg.rows * cfg.seq * cfg.hidden * 4 * microbatches if pp > 1 else 0.0
    return sync + tensor + pipe


def _cases(cfg: StackSweep) -> list[tuple[str, str, tuple[int, int, int]]]:
    unknown = [f for f in cfg.families if f not in FAMILIES]
    if unknown or not cfg.families:
        raise ValueError(f"families must be among {', '.join(FAMILIES)}; got {', '.join(unknown) or 'none'}.")
    return [(impl, family, tuple(dims)) for family in cfg.families for dims in (cfg.layouts or valid_layouts(cfg))
            for impl in cfg.impls]


def run_sweep(cfg: StackSweep, get_world, run_dir, progress=STDERR) -> int:
    cases = _cases(cfg)
    world = get_world(cfg.world_size)
    kept: dict = {}  # case -> every round's per-rank results
    for round_ in range(cfg.iters):
        last = round_ == cfg.iters - 1
        for done, case in enumerate(cases, 1):
            if round_ and declined(kept[case][-1]):  # unsupported, or failed: not asked again
                continue
            per_rank = call_case(world, bench_rank, cfg, *case, cfg.warmup if round_ == 0 else 0, last)
            kept.setdefault(case, []).append(per_rank)
            said = declined(per_rank)
            what = said["status"] if said else f"{max(r['time'] for r in per_rank) * 1e3:.1f} ms"
            print(f"[round {round_ + 1}/{cfg.iters}, {done}/{len(cases)}] stack {case[0]} {case[1]} "
                  f"{'x'.join(map(str, case[2]))}: {what}", file=progress)
    world.run(release_rank, timeout=60)
    for case in cases:
        row = _row(cfg, case, kept[case], world.backend)
        run_dir.append("benchmarks.csv", row)
        if row["status"] == "ok":
            print(f"stack {case[0]} {row['op']}: median {row['time_p50_us'] / 1e3:.1f} ms, "
                  f"{row['tokens_per_s']:.0f} tokens/s", file=progress)
    return len(cases)


def _row(cfg: StackSweep, case, rounds: list, backend: str) -> dict:
    from harness.cost_model.predict import gpt_workload, llama_workload, load_profile, planned_columns, predict_step
    from harness.runtime.timing import median_interval, summarize
    from reference.cost_model import bubble_fraction, training_memory

    impl, family, (dp, pp, tp) = case
    spec = spec_of(cfg, family)
    numel = sum(p.numel() for p in spec.build(0).parameters())
    m = 2 * pp
    row = {"suite": "stack", "op": f"{family_label(cfg, family)}/{dp}x{pp}x{tp}", "impl": impl, "backend": backend,
           "world_size": cfg.world_size, "dtype": "float32", "count": numel, "microbatches": m,
           "zero_stage": cfg.zero_stage, "iters": cfg.iters, "warmup": cfg.warmup,
           "detail": f"{cfg.schedule}, zero {cfg.zero_stage}, checkpointing {cfg.checkpointing}, {cfg.optimizer}"}
    said = declined(rounds[-1])  # unsupported at its first round, or failed at its last one (none follows it)
    if said:
        return {**row, **said}
    states = training_memory(numel, zero_stage=cfg.zero_stage, dp=dp, tp=tp, pp=pp, weight_bytes=4, grad_bytes=4,
                             optimizer_bytes=8 if cfg.optimizer in ("adam", "adamw") else 4)  # Adam: two moments
    final = rounds[-1]
    memories = [r["memory"] for r in final if r.get("memory")]
    worst = max(memories, key=lambda mem: sum(mem.values())) if memories else {}
    times = [[rnd[rank]["time"] for rnd in rounds] for rank in range(cfg.world_size)]
    row.update(status="ok", mem_params_bytes=worst.get("params"), mem_grads_bytes=worst.get("grads"),
               mem_optimizer_bytes=worst.get("optimizer"), mem_params_predicted=states.weights,
               mem_grads_predicted=states.gradients, mem_optimizer_predicted=states.optimizer,
               comm_bytes_measured=max(r["sent"] for r in final),
               comm_bytes_predicted=predicted_bytes(cfg, numel, dp, pp, tp, m),
               bubble_predicted=bubble_fraction("1f1b", pp, m), **summarize(times))
    if all("busy" in r for rnd in rounds for r in rnd):  # per round over every rank, then the median round
        row["bubble_measured"] = statistics.median(
            1 - sum(r["busy"] for r in rnd) / sum(r["makespan"] for r in rnd) for rnd in rounds)
    lo, hi, level = median_interval(row["samples_us"])
    row.update(rounds=cfg.iters, time_ci_lo_us=lo, time_ci_hi_us=hi, time_ci_level=level,
               tokens_per_s=dp * m * cfg.rows * cfg.seq / (row["time_p50_us"] / 1e6))
    profile = load_profile(cfg.profile)
    if profile is not None:
        work = (gpt_workload(cfg.vocab, cfg.hidden, cfg.heads, cfg.ffn, cfg.layers, cfg.seq, cfg.rows)
                if family == "gpt" else
                llama_workload(cfg.vocab, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.layers, cfg.seq, cfg.rows))
        row.update(planned_columns(predict_step(profile, work, dp, pp, tp, cfg.zero_stage, cfg.schedule, m,
                                                recompute=cfg.checkpointing)))
    return row
