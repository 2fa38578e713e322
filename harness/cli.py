"""``paritybench``: the command line.

    paritybench bench collectives [--impls ...] [--ops ...] [--world-sizes 2,4] [--min-bytes 1K] ...
    paritybench report RUN_DIR
    paritybench impls
    paritybench plan --params 70B --dp 64 --tp 8 --pp 4 --hidden 8192 --heads 64 --layers 80 ...

Every bad input gets one sentence on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys

from . import plan, registry
from .collectives.case import COLLECTIVES, DTYPES, OPS

EXIT_USAGE = 2
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
          "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


class UsageError(ValueError):
    """A bad input: the message is the one sentence the user sees."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 2, no usage dump
        raise UsageError(f"{message} (see '{self.prog} --help').")


def parse_bytes(text: str) -> int:
    """'1024', '1K', '64M', '64MiB', '1GB' -> bytes (K/M/G are binary, as in nccl-tests; KB/MB/GB decimal)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"size {text!r} is not a byte count; use e.g. 1024, 8K, 64M, 1G, 64MiB or 1GB.")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_list(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise UsageError(f"{what} {', '.join(bad) or repr(text)} not known; choose from {', '.join(valid)}.")
    return items


def parse_world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--world-sizes {text!r} must be comma-separated whole numbers, e.g. 2,4.") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"--world-sizes {text!r}: every world size must be at least 1.")
    return sizes


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="paritybench", description="Conformance and benchmarks for distributed-training parallelism.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench = sub.add_parser("bench", help="run a benchmark sweep into a new run folder")
    bsub = bench.add_subparsers(dest="suite", required=True, parser_class=_Parser)
    c = bsub.add_parser("collectives", help="nccl-tests-style size sweep of every collective")
    c.add_argument("--impls", default=None,
                   help="comma-separated implementations (default: every registered one)")
    c.add_argument("--impl", action="append", default=[], metavar="SPEC",
                   help="add an implementation: a registered name or package.module:object (repeatable)")
    c.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated collectives")
    c.add_argument("--world-sizes", default="2,4")
    c.add_argument("--min-bytes", default="1K")
    c.add_argument("--max-bytes", default="64M")
    c.add_argument("--factor", type=int, default=4, help="size multiplier between steps (>= 2)")
    c.add_argument("--iters", type=int, default=10)
    c.add_argument("--warmup", type=int, default=3)
    c.add_argument("--dtype", default="float32", choices=DTYPES)
    c.add_argument("--reduce-op", default="sum", choices=OPS)
    c.add_argument("--backend", default=None, choices=["gloo", "nccl"])
    c.add_argument("--results-dir", default="results/runs")
    c.add_argument("--no-report", action="store_true", help="do not write report.md at the end")
    r = sub.add_parser("report", help="write report.md and plots for a run folder")
    r.add_argument("run_dir")
    sub.add_parser("impls", help="list the registered implementations and whether they can run here")
    plan.add_parser(sub)
    s = sub.add_parser("schedule", help="print (and draw) a pipeline schedule and its simulated metrics")
    s.add_argument("name", choices=["gpipe", "1f1b", "interleaved", "zb-h1"])
    s.add_argument("--p", type=int, required=True, help="pipeline ranks")
    s.add_argument("--m", type=int, required=True, help="microbatches")
    s.add_argument("--v", type=int, default=2, help="model chunks per rank (interleaved)")
    s.add_argument("--costs", default="F=1,B=2,I=1,W=1,comm=0", help="per-kind costs for the simulation")
    s.add_argument("--lowered", action="store_true", help="show explicit SEND/RECV actions")
    s.add_argument("--png", default=None, help="also draw a Gantt chart to this file")
    return p


def _bench_collectives(args) -> int:
    from .collectives.bench import SweepConfig, run_sweep
    from .results import RunDir
    from .world import World

    specs = [s.strip() for s in args.impls.split(",") if s.strip()] if args.impls else \
        (registry.names("collectives") if not args.impl else [])
    specs += args.impl
    for spec in specs:
        try:
            registry.check(spec, "collectives")
        except registry.RegistryError as exc:
            raise UsageError(str(exc)) from None
    skipped = {s: registry.skip_reason(registry.resolve(s, "collectives")) for s in specs}
    for spec, reason in skipped.items():
        if reason:
            print(f"paritybench: skipping {spec}: {reason}.", file=sys.stderr)
    cfg = SweepConfig(
        impls=[s for s in specs if not skipped[s]], ops=parse_list(args.ops, COLLECTIVES, "collective(s)"),
        world_sizes=parse_world_sizes(args.world_sizes), min_bytes=parse_bytes(args.min_bytes),
        max_bytes=parse_bytes(args.max_bytes), factor=args.factor, iters=args.iters, warmup=args.warmup,
        dtype=args.dtype, reduce_op=args.reduce_op)
    if cfg.min_bytes < 1 or cfg.min_bytes > cfg.max_bytes:
        raise UsageError(f"--min-bytes ({cfg.min_bytes}) must be at least 1 and at most --max-bytes ({cfg.max_bytes}).")
    if cfg.factor < 2:
        raise UsageError(f"--factor must be a whole number of at least 2; got {cfg.factor}.")
    if cfg.iters < 1 or cfg.warmup < 0:
        raise UsageError(f"--iters must be >= 1 and --warmup >= 0; got {cfg.iters} and {cfg.warmup}.")
    if not cfg.impls:
        raise UsageError("no implementation can run here (every one requested was skipped).")
    run = RunDir(args.results_dir, {"suite": "collectives", "config": vars(cfg)})
    print(f"paritybench: run folder {run.path}", file=sys.stderr)
    worlds: dict[int, World] = {}

    def get_world(n: int) -> World:
        for size in [s for s in worlds if s != n]:  # one world at a time: 2 cores, up to 8 ranks
            worlds.pop(size).close()
        if n not in worlds:
            worlds[n] = World(n, backend=args.backend, timeout=300)
        return worlds[n]

    try:
        run.update(backend=get_world(cfg.world_sizes[0]).backend)
        run_sweep(cfg, get_world, run)
    except BaseException:
        run.finish("incomplete")
        raise
    finally:
        for w in worlds.values():
            w.close()
    run.finish("complete")
    if not args.no_report:
        from .report import write_report

        print(f"paritybench: report {write_report(run.path)}", file=sys.stderr)
    print(run.path)
    return 0


def _schedule(args) -> int:
    from reference.pipeline import GENERATORS, add_send_recv, simulate, validate
    from reference.pipeline.draw import gantt_png, metrics_text, text_grid

    try:
        costs = {k.strip(): float(v) for k, v in (kv.split("=") for kv in args.costs.split(","))}
    except ValueError:
        raise UsageError(f"--costs {args.costs!r} must look like F=1,B=2,I=1,W=1,comm=0.") from None
    bad = set(costs) - {"F", "B", "I", "W", "comm"}
    if bad or any(v < 0 for v in costs.values()):
        raise UsageError(f"--costs takes non-negative F, B, I, W and comm; got {args.costs!r}.")
    try:
        schedule = GENERATORS[args.name](args.p, args.m, args.v) if args.name == "interleaved" \
            else GENERATORS[args.name](args.p, args.m)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.lowered:
        schedule = add_send_recv(schedule)
    validate(schedule)
    timeline = simulate(schedule, costs)
    print(schedule)
    print()
    print(text_grid(timeline))
    print(metrics_text(timeline))
    if args.png:
        gantt_png(timeline, args.png, f"{schedule.name}, p={args.p}, m={args.m}: {metrics_text(timeline)}")
        print(f"wrote {args.png}")
    return 0


def _impls(_args) -> int:
    for paradigm in ("collectives",):
        for name in registry.names(paradigm):
            impl = registry.resolve(name, paradigm)
            reason = registry.skip_reason(impl)
            print(f"{paradigm:12s} {name:18s} {'skipped: ' + reason if reason else impl.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .report import write_report
    from .results import ResultsError

    try:
        args = _build_parser().parse_args(argv)
        if args.command == "bench":
            return _bench_collectives(args)
        if args.command == "report":
            print(write_report(args.run_dir))
            return 0
        if args.command == "plan":
            return plan.run(args)
        if args.command == "schedule":
            return _schedule(args)
        return _impls(args)
    except (UsageError, ResultsError, registry.RegistryError, plan.PlanError) as exc:
        print(f"paritybench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("paritybench: interrupted; finished rows are kept in the run folder.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
