"""``paritybench bench collectives | pipeline | all``: sweeps into one new run folder, then report.md."""

from __future__ import annotations

import sys
import time
from collections import Counter

from . import registry
from .collectives.case import COLLECTIVES, DTYPES, OPS
from .errors import UsageError
from .parsing import parse_bytes, parse_list, parse_world_sizes

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def add_parsers(sub) -> None:
    bench = sub.add_parser("bench", help="run benchmark sweeps into a new run folder")
    bsub = bench.add_subparsers(dest="suite", required=True, parser_class=type(bench))
    for name, helptext in (("collectives", "nccl-tests-style size sweep of every collective"),
                           ("pipeline", "step time and bubble per schedule, measured vs simulated"),
                           ("tensor_parallel", "forward+backward time and bytes per sharded layer"),
                           ("zero", "step time, memory per rank and bytes per DP / ZeRO stage"),
                           ("checkpoint", "activation memory and step time with and without checkpointing"),
                           ("stack", "every dp x pp x tp layout of one world size per stack and family (through the "
                                     "stack contract): step time, tokens/s, model state and bytes per rank vs plan"),
                           ("3d", "the reference stack's GPT per layout with the bf16 / clip variants and the "
                                  "measured bubble"),
                           ("resume", "save and load time, GB/s and bytes per rank of the 3D stack's state"),
                           ("context_parallel", "one attention layer per implementation vs sequence length and cp: "
                                                "time and bytes per rank vs the cost model"),
                           ("expert_parallel", "one MoE layer per implementation vs ep, tokens and skew: time, "
                                               "dispatch time and bytes per rank vs the cost model"),
                           ("matrix", "every installed stack held to one device over one fixed set of cases "
                                      "(layouts, schedules, seams): the conformance matrix of the report"),
                           ("all", "collectives, pipeline, zero, checkpoint, stack, then the stack matrix, into one "
                                   "run folder")):
        p = bsub.add_parser(name, help=helptext)
        p.add_argument("--impls", default=None, help="comma-separated implementations (default: all registered)")
        p.add_argument("--impl", action="append", default=[], metavar="SPEC",
                       help="add an implementation: a registered name or package.module:object (repeatable)")
        p.add_argument("--world-sizes", default="auto",
                       help="comma-separated world sizes, or auto: 2,4 on CPU (pipeline: 2); on a GPU node 2, 3, "
                            "the powers of two up to the GPU count and the count; under torchrun the job's size")
        p.add_argument("--iters", type=int, default=10 if name != "pipeline" else 5)
        p.add_argument("--warmup", type=int, default=3 if name != "pipeline" else 2,
                       help="untimed iterations first (collectives: the exact check is the first; zero: the first "
                            "step and the counted one are the first two)")
        p.add_argument("--backend", default=None, choices=["gloo", "nccl"])
        p.add_argument("--results-dir", default="results/runs")
        p.add_argument("--no-report", action="store_true", help="do not write report.md at the end")
        if name in ("collectives", "all"):
            p.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated collectives")
            p.add_argument("--min-bytes", default="1K")
            p.add_argument("--max-bytes", default="64M")
            p.add_argument("--factor", type=int, default=4, help="size multiplier between steps (>= 2)")
            p.add_argument("--dtype", default="float32", choices=DTYPES)
            p.add_argument("--reduce-op", default="sum", choices=OPS)
        if name in ("pipeline", "all"):
            p.add_argument("--schedules", default=",".join(SCHEDULES))
            p.add_argument("--pipeline-world-sizes", default="auto",
                           help="pipeline ranks p, or auto (2 on CPU: 2 cores; on a GPU node as --world-sizes)")
            p.add_argument("--microbatches", default="2,4,8")
            p.add_argument("--virtual-stages", type=int, default=2)
            p.add_argument("--hidden", type=int, default=512)
        if name in ("zero", "all"):
            p.add_argument("--stages", default="0,1,2,3", help="ZeRO stages (0: plain data parallelism)")
            p.add_argument("--zero-world-sizes", default=None, help="DP sizes (default: --world-sizes)")
            p.add_argument("--zero-hidden", type=int, default=256, help="transformer block width")
            p.add_argument("--zero-variants", default="plain,bf16,clip",
                           help="plain; bf16 (the reference in mixed precision); clip (every implementation "
                                "clipping at 1.0, at the largest DP size)")
        if name in ("checkpoint", "all"):
            p.add_argument("--layers", default="4,16,64", help="layer counts L of the checkpointed stack")
            p.add_argument("--policies", default="layer,sqrt", help="checkpointing policies")
        if name in ("pipeline", "3d", "stack", "all"):
            p.add_argument("--profile", default=None, metavar="PROFILE.json",
                           help="predict each step with this machine profile (default: calibrate first, into this "
                                "run folder: calibration.csv and profile.json)")
        if name == "3d":
            p.add_argument("--3d-world-size", dest="threed_world_size", type=int, default=8,
                           help="ranks of the 3D layouts (8 on 2 cores: oversubscribed, compare layouts only)")
            p.add_argument("--3d-schedule", dest="threed_schedule", default="1f1b",
                           choices=["gpipe", "1f1b", "interleaved"])
            p.add_argument("--3d-zero", dest="threed_zero", type=int, default=1, choices=[0, 1, 2])
            p.add_argument("--3d-checkpointing", dest="threed_checkpointing", action="store_true")
            p.add_argument("--3d-variants", dest="threed_variants", default="plain",
                           help="comma-separated among plain, bf16 (bfloat16 with fp32 masters), clip (global "
                                "gradient-norm clipping at 1.0); opt-in: each adds one run of every layout")
        if name in ("stack", "all"):
            p.add_argument("--families", default="gpt,llama", help="comma-separated among gpt, llama")
            p.add_argument("--stack-world-size", dest="stack_world_size", type=int, default=8,
                           help="ranks of the layouts (8 on 2 cores: oversubscribed, compare layouts only)")
            p.add_argument("--stack-schedule", dest="stack_schedule", default="1f1b",
                           choices=["gpipe", "1f1b", "interleaved"])
            p.add_argument("--stack-zero", dest="stack_zero", type=int, default=2, choices=[0, 1, 2, 3],
                           help="ZeRO stage over dp (2: what every stack here shards; FSDP2 is 2 or 3)")
            p.add_argument("--stack-optimizer", dest="stack_optimizer", default="sgd", choices=["sgd", "adam"],
                           help="the stacks' optimizer (adam: the one every stack here trains)")
            p.add_argument("--stack-layouts", dest="stack_layouts", default=None,
                           help="comma-separated dpxppxtp layouts (default: every one the model allows)")
        if name == "context_parallel":
            p.add_argument("--seqs", default="256,1024,2048", help="comma-separated sequence lengths")
        if name == "expert_parallel":
            p.add_argument("--tokens", default="256,1024", help="comma-separated tokens per rank")
            p.add_argument("--experts", type=int, default=8)
            p.add_argument("--top-k", dest="top_k", type=int, default=2)
        if name == "tensor_parallel":
            p.add_argument("--hidden", type=int, default=512)
            p.add_argument("--ffn", type=int, default=2048)
            p.add_argument("--seq", type=int, default=256)
            p.add_argument("--batch", type=int, default=4)


def _ep_impls(args) -> list[str]:
    """The expert-parallel sweep's implementations: ``_impls``'s, with the installed third-party MoE layers beside
    them where none is named (``--impls`` / ``--impl`` may name those too)."""
    from .expert_parallel import bench as ep_bench

    named = [s.strip() for s in (args.impls or "").split(",") if s.strip()] + list(args.impl)
    third = [s for s in named if s in ep_bench.THIRD_PARTY]
    for spec in third:
        if spec not in ep_bench.installed_third_parties():
            raise UsageError(f"{spec} needs {', '.join(ep_bench.THIRD_PARTY[spec].requires)}, which is not installed.")
    if not named:
        return _impls(args, "expert_parallel") + ep_bench.installed_third_parties()
    rest = [s for s in named if s not in ep_bench.THIRD_PARTY]
    return (_impls(args, "expert_parallel", rest) if rest else []) + third


def _impls(args, paradigm: str, specs: list[str] | None = None) -> list[str]:
    """``specs`` (default: --impls and --impl, or every registered implementation) that can run here."""
    if specs is None:
        specs = [s.strip() for s in args.impls.split(",") if s.strip()] if args.impls else \
            (registry.names(paradigm) if not args.impl else [])
        specs += args.impl
    runnable = []
    for spec in specs:
        try:
            impl = registry.check(spec, paradigm)
        except registry.RegistryError as exc:
            raise UsageError(str(exc)) from None
        reason = registry.skip_reason(impl)
        if reason:
            print(f"paritybench: skipping {spec}: {reason}.", file=sys.stderr)
        else:
            runnable.append(spec)
    if not runnable:
        raise UsageError(f"no {paradigm} implementation can run here (every one requested was skipped).")
    return runnable


def _sizes(args, text: str, cpu_default: str = "2,4") -> list[int]:
    """World sizes of a sweep: as given, or ``auto`` (see ``parsing.auto_world_sizes``; benchmarks start at 2)."""
    return parse_world_sizes(text, args.backend, cpu_default, minimum=2)


def _check_counts(args) -> None:
    from .hang import window_s

    if args.iters < 1 or args.warmup < 0:
        raise UsageError(f"--iters must be >= 1 and --warmup >= 0; got {args.iters} and {args.warmup}.")
    window_s()  # a malformed PARITYBENCH_HANG_WINDOW_S is said before any run folder exists


def collectives_config(args):
    from .collectives.bench import SweepConfig

    cfg = SweepConfig(
        impls=_impls(args, "collectives"), ops=parse_list(args.ops, COLLECTIVES, "collective(s)"),
        world_sizes=_sizes(args, args.world_sizes), min_bytes=parse_bytes(args.min_bytes),
        max_bytes=parse_bytes(args.max_bytes), factor=args.factor, iters=args.iters, warmup=args.warmup,
        dtype=args.dtype, reduce_op=args.reduce_op)
    if cfg.min_bytes < 1 or cfg.min_bytes > cfg.max_bytes:
        raise UsageError(f"--min-bytes ({cfg.min_bytes}) must be at least 1 and at most --max-bytes ({cfg.max_bytes}).")
    if cfg.factor < 2:
        raise UsageError(f"--factor must be a whole number of at least 2; got {cfg.factor}.")
    return cfg


def pipeline_config(args):
    from .pipeline.bench import PipelineSweep

    sizes = args.pipeline_world_sizes if args.suite == "all" else args.world_sizes
    micro = [int(t) for t in args.microbatches.split(",") if t.strip().isdigit()]
    if not micro or len(micro) != len([t for t in args.microbatches.split(",") if t.strip()]) or min(micro) < 1:
        raise UsageError(f"--microbatches {args.microbatches!r} must be comma-separated whole numbers >= 1.")
    if args.virtual_stages < 1 or args.hidden < 1:
        raise UsageError(f"--virtual-stages and --hidden must be >= 1; got {args.virtual_stages}, {args.hidden}.")
    if args.suite == "pipeline":
        impls = _impls(args, "pipeline")
    else:  # bench all: --impls/--impl choose collectives; every runnable pipeline implementation runs
        impls = [s for s in registry.names("pipeline") if registry.skip_reason(registry.resolve(s, "pipeline")) is None]
    return PipelineSweep(impls=impls, schedules=parse_list(args.schedules, SCHEDULES, "schedule(s)"),
                         world_sizes=_sizes(args, sizes, "2"), microbatches=micro,
                         virtual_stages=args.virtual_stages, hidden=args.hidden, iters=args.iters,
                         warmup=args.warmup)


def _variants(text: str, flag: str, valid: tuple[str, ...]) -> list[str]:
    variants = [t.strip() for t in text.split(",") if t.strip()]
    if not variants or any(v not in valid for v in variants):
        raise UsageError(f"{flag} {text!r} must be comma-separated among {', '.join(valid)}.")
    return variants


def zero_config(args):
    from .zero.bench import ZeroSweep

    stages = [t.strip() for t in args.stages.split(",") if t.strip()]
    if not stages or any(t not in ("0", "1", "2", "3") for t in stages):
        raise UsageError(f"--stages {args.stages!r} must be comma-separated ZeRO stages among 0, 1, 2, 3.")
    if args.zero_hidden < 1:
        raise UsageError(f"--zero-hidden must be >= 1; got {args.zero_hidden}.")
    from .zero.bench import VARIANTS

    variants = _variants(args.zero_variants, "--zero-variants", VARIANTS)
    if args.suite == "zero":
        impls = _impls(args, "zero")
    else:  # bench all: --impls/--impl choose collectives; every runnable zero implementation runs
        impls = [s for s in registry.names("zero") if not registry.resolve(s, "zero").only_ops
                 and registry.skip_reason(registry.resolve(s, "zero")) is None]
    return ZeroSweep(impls=impls, world_sizes=_sizes(args, args.zero_world_sizes or args.world_sizes),
                     stages=[int(t) for t in stages], hidden=args.zero_hidden, iters=args.iters, warmup=args.warmup,
                     variants=variants)


def checkpoint_config(args):
    from .checkpoint.bench import CheckpointSweep
    from .contracts.checkpoint import POLICIES

    layers = [t.strip() for t in args.layers.split(",") if t.strip()]
    if not layers or not all(t.isdigit() and int(t) >= 1 for t in layers):
        raise UsageError(f"--layers {args.layers!r} must be comma-separated whole numbers >= 1.")
    if args.suite == "checkpoint":
        impls = _impls(args, "checkpoint")
    else:
        impls = [s for s in registry.names("checkpoint")
                 if registry.skip_reason(registry.resolve(s, "checkpoint")) is None]
    return CheckpointSweep(impls=impls, layers=[int(t) for t in layers],
                           policies=parse_list(args.policies, POLICIES, "polic(ies)"), iters=args.iters,
                           warmup=args.warmup)


def threed_config(args):
    from .threed.bench import VARIANTS, ThreeDSweep, valid_layouts

    if args.threed_world_size < 1:
        raise UsageError(f"--3d-world-size must be >= 1; got {args.threed_world_size}.")
    variants = _variants(args.threed_variants, "--3d-variants", VARIANTS)
    cfg = ThreeDSweep(world_size=args.threed_world_size, schedule=args.threed_schedule, zero_stage=args.threed_zero,
                      checkpointing=args.threed_checkpointing, iters=min(args.iters, 5), warmup=min(args.warmup, 1),
                      variants=variants)
    if not valid_layouts(cfg):
        raise UsageError(f"no dp x pp x tp layout of {cfg.world_size} ranks fits the model ({cfg.heads} heads, "
                         f"{cfg.layers} layers).")
    return cfg


def stack_config(args):
    from .stack.bench import FAMILIES, StackSweep, valid_layouts

    if args.stack_world_size < 1:
        raise UsageError(f"--stack-world-size must be >= 1; got {args.stack_world_size}.")
    cfg = StackSweep(impls=[], families=parse_list(args.families, FAMILIES, "famil(ies)"),
                     world_size=args.stack_world_size, schedule=args.stack_schedule, zero_stage=args.stack_zero,
                     optimizer=args.stack_optimizer,
                     iters=min(args.iters, 3), warmup=min(args.warmup, 1))
    allowed = valid_layouts(cfg)
    if args.stack_layouts:
        cfg.layouts = [_layout(t, cfg.world_size) for t in args.stack_layouts.split(",") if t.strip()]
        bad = [d for d in cfg.layouts if d not in allowed]
        if bad or not cfg.layouts:
            raise UsageError(f"--stack-layouts {args.stack_layouts!r}: each must be dpxppxtp of {cfg.world_size} ranks "
                             f"that the model allows ({', '.join('x'.join(map(str, d)) for d in allowed)}).")
    if not allowed:
        raise UsageError(f"no dp x pp x tp layout of {cfg.world_size} ranks fits the model ({cfg.heads} heads, "
                         f"{cfg.layers} layers).")
    # the implementations last: a bad argument is the only line, not after a "skipping ..." for each missing stack
    cfg.impls = _impls(args, "stack") if args.suite == "stack" else \
        [s for s in registry.names("stack") if registry.skip_reason(registry.resolve(s, "stack")) is None]
    return cfg


def _layout(text: str, world_size: int) -> tuple[int, ...]:
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise UsageError(f"layout {text.strip()!r} must be dpxppxtp, three whole numbers >= 1 (e.g. 2x2x2).")
    return tuple(int(p) for p in parts)


def _with_calibration(args, plans: list) -> list:
    """Without --profile, a calibration sweep at the pipeline's and the 3D layouts' world sizes runs just
    before each (whose World is then already up), so their rows carry the time this machine predicts."""
    if getattr(args, "profile", None) is not None or args.suite not in ("pipeline", "3d", "stack", "all"):
        return plans
    from .calibrate.sweep import CalibrationSweep, run_sweep

    def calibrate(cfg, get_world, run):
        from .calibrate.build import profile_from_run

        run_sweep(cfg, get_world, run)
        profile_from_run(run.path).save(run.path / "profile.json")

    out, calibrated = [], set()
    for name, cfg, sweep in plans:
        if name in ("pipeline", "3d", "stack") and tuple(cfg.world_sizes) not in calibrated:
            calibrated.add(tuple(cfg.world_sizes))
            out.append(("calibrate", CalibrationSweep(world_sizes=list(cfg.world_sizes)), calibrate))
        out.append((name, cfg, sweep))
    return out


def _check_profile(args, plans: list) -> None:
    """A --profile must answer for every world size the pipeline and 3D sweeps run (and the backend asked)."""
    if not getattr(args, "profile", None):
        return
    from .calibrate.profile import Profile, ProfileError

    try:
        profile = Profile.load(args.profile)
        for n in sorted({n for name, cfg, _ in plans if name in ("pipeline", "3d", "stack") for n in cfg.world_sizes}):
            profile.check(args.backend or None, n)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def _point_at_profile(args, plans: list, run) -> None:
    from dataclasses import asdict
    from pathlib import Path

    path = args.profile if getattr(args, "profile", None) else str(Path(run.path) / "profile.json")
    calibration = [asdict(cfg) for name, cfg, _ in plans if name == "calibrate"]
    if calibration:
        run.update(calibration=calibration)
    for name, cfg, _ in plans:
        if name in ("pipeline", "3d", "stack"):
            cfg.profile = path


def run_plans(run, plans: list, backend: str | None) -> None:
    """Run each (name, config, sweep) into ``run`` on Worlds made as needed and kept warm until the end (a
    World's idle ranks cost no CPU since their gloo groups share one device, and ``bench all`` returns to sizes
    2, 4 and 8 after other sizes: each respawn cost seconds), then mark the folder complete; incomplete on any
    error or interrupt."""
    from . import placement
    from .world import World

    worlds: dict[int, World] = {}

    def get_world(n: int) -> World:
        if n not in worlds:
            worlds[n] = World(n, backend=backend, timeout=600)
            placement.record(run, worlds[n])
        return worlds[n]

    sections: list[dict] = []
    try:
        started = time.monotonic()
        sizes = getattr(plans[0][1], "world_sizes", None)  # checkpointing runs in this process: no World
        run.update(backend=get_world(sizes[0]).backend if sizes else "none")
        for name, cfg, sweep in plans:
            sweep(cfg, get_world, run)
            # wall seconds per section, the first one's World start-up included; in run.json as each ends
            sections.append({"section": name, "seconds": round(time.monotonic() - started, 1)})
            run.update(sections=sections)
            started = time.monotonic()
    except BaseException:
        run.finish("incomplete")
        raise
    finally:
        for w in worlds.values():
            w.close()
    run.finish("complete")


def run(args) -> int:
    from dataclasses import asdict

    from .collectives import bench as coll_bench
    from .pipeline import bench as pipe_bench
    from .results import RunDir

    _check_counts(args)
    plans = []
    if args.suite in ("collectives", "all"):
        plans.append(("collectives", collectives_config(args), coll_bench.run_sweep))
    if args.suite in ("pipeline", "all"):
        plans.append(("pipeline", pipeline_config(args), pipe_bench.run_sweep))
    if args.suite in ("zero", "all"):
        from .zero import bench as zero_bench

        plans.append(("zero", zero_config(args), zero_bench.run_sweep))
    if args.suite in ("checkpoint", "all"):
        from .checkpoint import bench as ckpt_bench

        plans.append(("checkpoint", checkpoint_config(args), ckpt_bench.run_sweep))
    if args.suite == "3d":
        from .threed import bench as threed_bench

        plans.append(("3d", threed_config(args), threed_bench.run_sweep))
    if args.suite in ("stack", "all"):
        from .stack import bench as stack_bench

        stack_cfg = stack_config(args)
        plans.append(("stack", stack_cfg, stack_bench.run_sweep))
        if args.suite == "all":  # the installed third parties beside ours, each at the ZeRO stage it shards with
            plans += [("stack", cfg, stack_bench.run_sweep)
                      for cfg in stack_bench.third_party_sweeps(stack_cfg, stack_cfg.impls)]
    if args.suite in ("matrix", "all"):
        from .stack import matrix

        impls = _impls(args, "stack") if args.suite == "matrix" else []
        plans.append(("matrix", matrix.MatrixSweep(impls=impls), matrix.run_sweep))
    if args.suite == "resume":
        from .resume.bench import ResumeSweep
        from .resume.bench import run_sweep as resume_sweep

        plans.append(("resume", ResumeSweep(world_sizes=_sizes(args, args.world_sizes), iters=min(args.iters, 3),
                                            warmup=min(args.warmup, 1)), resume_sweep))
    if args.suite == "context_parallel":
        from .context_parallel import bench as cp_bench

        seqs = [t.strip() for t in args.seqs.split(",") if t.strip()]
        if not seqs or not all(t.isdigit() and int(t) >= 1 for t in seqs):
            raise UsageError(f"--seqs {args.seqs!r} must be comma-separated whole numbers >= 1.")
        sizes = _sizes(args, args.world_sizes)
        bad = [int(t) for t in seqs for n in sizes if int(t) % (2 * n)]
        if bad:  # checked before the implementations are resolved: the error is the only line
            raise UsageError(f"--seqs: {bad[0]} tokens do not split into the 2 cp chunks the zigzag layout needs at "
                             f"every --world-sizes cp ({', '.join(map(str, sizes))}).")
        cfg = cp_bench.ContextParallelSweep(impls=_impls(args, "context_parallel"), world_sizes=sizes,
                                            seqs=[int(t) for t in seqs], iters=min(args.iters, 5),
                                            warmup=min(args.warmup, 1))
        plans.append(("context_parallel", cfg, cp_bench.run_sweep))
    if args.suite == "expert_parallel":
        from .expert_parallel import bench as ep_bench

        tokens = [t.strip() for t in args.tokens.split(",") if t.strip()]
        if not tokens or not all(t.isdigit() and int(t) >= 1 for t in tokens):
            raise UsageError(f"--tokens {args.tokens!r} must be comma-separated whole numbers >= 1.")
        sizes = _sizes(args, args.world_sizes)
        if args.experts < 1 or not 1 <= args.top_k <= args.experts:
            raise UsageError(f"--experts must be >= 1 and --top-k between 1 and it; got {args.experts} and "
                             f"{args.top_k}.")
        bad = [n for n in sizes if args.experts % n or args.top_k > args.experts // n]
        if bad:  # the skewed router sends every token to EP rank 0's E / ep experts: k of them must exist
            raise UsageError(f"--experts ({args.experts}) must split over every --world-sizes ep into at least "
                             f"--top-k ({args.top_k}) per rank; ep = {bad[0]} does not.")
        cfg = ep_bench.ExpertParallelSweep(impls=_ep_impls(args), world_sizes=sizes,
                                           tokens=[int(t) for t in tokens], experts=args.experts, top_k=args.top_k,
                                           iters=min(args.iters, 5), warmup=min(args.warmup, 1))
        plans.append(("expert_parallel", cfg, ep_bench.run_sweep))
    if args.suite == "tensor_parallel":
        from .tensor_parallel import bench as tp_bench

        if min(args.hidden, args.ffn, args.seq, args.batch) < 1:
            raise UsageError("--hidden, --ffn, --seq and --batch must be >= 1.")
        cfg = tp_bench.TensorParallelSweep(impls=_impls(args, "tensor_parallel"),
                                           world_sizes=_sizes(args, args.world_sizes), seq=args.seq,
                                           batch=args.batch, hidden=args.hidden, ffn=args.ffn, iters=args.iters,
                                           warmup=args.warmup)
        plans.append(("tensor_parallel", cfg, tp_bench.run_sweep))
    plans = _with_calibration(args, plans)
    _check_profile(args, plans)
    config, seen = {}, Counter()
    for name, cfg, _ in plans:  # a second sweep of one suite (bench all's third-party stacks) keyed stack:2, ...
        if name != "calibrate":
            seen[name] += 1
            config[name if seen[name] == 1 else f"{name}:{seen[name]}"] = asdict(cfg)
    run = RunDir(args.results_dir, {"suite": args.suite, "config": config})
    print(f"paritybench: run folder {run.path}", file=sys.stderr)
    _point_at_profile(args, plans, run)
    run_plans(run, plans, args.backend)
    if not args.no_report:
        from .report import write_report

        started = time.monotonic()
        path = write_report(run.path)
        run.update(report_seconds=round(time.monotonic() - started, 1))  # after the report: in run.json only
        print(f"paritybench: report {path} ({run.meta['report_seconds']:g} s)", file=sys.stderr)
    print(run.path)
    return 0
