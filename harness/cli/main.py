"""``paritybench``: the command line.

    paritybench bench collectives [--impls ...] ...   # or pipeline, zero, stack, ... (bench --help), or all
    paritybench report [BASELINE] RUN_DIR
    paritybench compare BASELINE NEW [--time-threshold 10%] [--confidence 0.99] [--format text|markdown|json]
    paritybench baseline RUN [RUN ...] --out results/baselines/<name>/
    paritybench impls
    paritybench test [PARADIGM ...] --impl pkg.mod:obj [pytest args]   # the installed suites, by pytest
    paritybench plan --params 70B --dp 64 --tp 8 --pp 4 --hidden 8192 --heads 64 --layers 80 ...
    paritybench localise IMPL --family gpt --layout 2x1x2 [--accumulation 2 --clip 0.05 ...]   # where and why
    paritybench calibrate --out PROFILE.json [--world-sizes 2,4,8]   # this machine's profile for plan and bench
    paritybench schedule 1f1b --p 4 --m 8 [--v 2] [--png FILE]   # a pipeline schedule, its grid and metrics

Every bad input gets one sentence on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from harness.cli import bench as bench_cli
from harness.cli import plan
from harness.cli import test as suite_cli
from harness.cli.parsing import output_path, parse_bytes, parse_list, parse_world_sizes  # noqa: F401 - re-exported for users
from harness.cost_model import cli as calibrate_cli
from harness.errors import UsageError
from harness.gate import cli as gate_cli
from harness.gate.inputs import GateError
from harness.localise import cli as localise_cli
from harness.records import registry
from reference.pipeline import GENERATORS

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 2, no usage dump
        raise UsageError(f"{message} (see '{self.prog} --help').")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="paritybench", description="Conformance and benchmarks for distributed-training parallelism.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    bench_cli.add_parsers(sub)
    r = sub.add_parser("report", help="write report.md and plots for a run folder (given two: the second, "
                                      "with a comparison section against the first)")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="RUN_DIR, or BASELINE RUN_DIR")
    gate_cli.add_parsers(sub)
    sub.add_parser("impls", help="list the registered implementations and whether they can run here")
    plan.add_parser(sub)
    calibrate_cli.add_parser(sub)
    suite_cli.add_parser(sub)
    localise_cli.add_parser(sub)
    s = sub.add_parser("schedule", help="print (and draw) a pipeline schedule and its simulated metrics")
    s.add_argument("name", choices=list(GENERATORS))
    s.add_argument("--p", type=int, required=True, help="pipeline ranks")
    s.add_argument("--m", type=int, required=True, help="microbatches")
    s.add_argument("--v", type=int, default=2, help="model chunks per rank (interleaved)")
    s.add_argument("--costs", default="F=1,B=2,I=1,W=1,comm=0", help="per-kind costs for the simulation")
    s.add_argument("--lowered", action="store_true", help="show explicit SEND/RECV actions")
    s.add_argument("--png", default=None, help="also draw a Gantt chart to this file")
    return p


def _schedule(args) -> int:
    from reference.pipeline import add_send_recv, generate, simulate, validate
    from reference.pipeline.draw import gantt_png, metrics_text, text_grid

    try:
        costs = {k.strip(): float(v) for k, v in (kv.split("=") for kv in args.costs.split(","))}
    except ValueError:
        raise UsageError(f"--costs {args.costs!r} must look like F=1,B=2,I=1,W=1,comm=0.") from None
    bad = set(costs) - {"F", "B", "I", "W", "F&B", "comm"}
    if bad or any(v < 0 for v in costs.values()):
        raise UsageError(f"--costs takes non-negative F, B, I, W, F&B (an overlapped pair) and comm; "
                         f"got {args.costs!r}.")
    if args.png:
        output_path(args.png, "--png")
    try:
        schedule = generate(args.name, args.p, args.m, args.v)
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
    from harness.contracts import CONTRACTS
    from harness.records.releases import TESTED, release_note

    for paradigm in CONTRACTS:
        for name in registry.names(paradigm):
            impl = registry.resolve(name, paradigm)
            reason = registry.skip_reason(impl)
            print(f"{paradigm:16s} {name:18s} {'skipped: ' + reason if reason else impl.description}")
    print("\nreleases installed:")
    for note in filter(None, map(release_note, TESTED)):
        print(f"  {note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from harness.cli.report import write_report
    from harness.records.results import ResultsError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["test"]:  # pytest's own options follow: not argparse's to parse
            return suite_cli.run(argv[1:])
        args = _build_parser().parse_args(argv)
        if args.command == "bench":
            return bench_cli.run(args)
        if args.command == "report":
            if len(args.run_dirs) > 2:
                raise UsageError(f"report takes RUN_DIR or BASELINE RUN_DIR; got {len(args.run_dirs)} folders.")
            print(write_report(args.run_dirs[-1], baseline=args.run_dirs[0] if len(args.run_dirs) == 2 else None))
            return 0
        if args.command == "compare":
            return gate_cli.run_compare(args)
        if args.command == "baseline":
            return gate_cli.run_baseline(args)
        if args.command == "calibrate":
            return calibrate_cli.run(args)
        if args.command == "plan":
            return plan.run(args)
        if args.command == "schedule":
            return _schedule(args)
        if args.command == "localise":
            return localise_cli.run(args)
        return _impls(args)
    except (UsageError, ResultsError, GateError, registry.RegistryError, plan.PlanError) as exc:
        print(f"paritybench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("paritybench: interrupted; finished rows are kept in the run folder.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
