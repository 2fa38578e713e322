"""``paritybench bench <sweep> | all``: sweeps into one new run folder, then report.md.

Every sweep is a ``harness.paradigm.Bench`` of some paradigm's record: its options, its place in ``bench all``,
whether it is calibrated. This module names none of them."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from harness.cli.sweep_args import add_profile
from harness.errors import UsageError
from harness.paradigm import benches, load


def _chosen(suite: str) -> list[str]:
    """The sweeps ``bench <suite>`` runs, in order: itself, or ``bench all``'s."""
    if suite != "all":
        return [suite]
    return [b.name for b in sorted((b for b in benches().values() if b.in_all is not None), key=lambda b: b.in_all)]


def _calibrated(name: str) -> bool:
    return name in benches() and benches()[name].calibrated


def _add_common(p, iters: int, warmup: int) -> None:
    p.add_argument("--impls", default=None, help="comma-separated implementations (default: all registered)")
    p.add_argument("--impl", action="append", default=[], metavar="SPEC",
                   help="add an implementation: a registered name or package.module:object (repeatable)")
    p.add_argument("--world-sizes", default="auto",
                   help="comma-separated world sizes, or auto: 2,4 on CPU (pipeline: 2); on a GPU node 2, 3, "
                        "the powers of two up to the GPU count and the count; under torchrun the job's size")
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--warmup", type=int, default=warmup,
                   help="untimed iterations first (collectives: the exact check is the first; zero: the first "
                        "step and the counted one are the first two)")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"])
    p.add_argument("--results-dir", default="results/runs")
    p.add_argument("--no-report", action="store_true", help="do not write report.md at the end")


def add_parsers(sub) -> None:
    bench = sub.add_parser("bench", help="run benchmark sweeps into a new run folder")
    bsub = bench.add_subparsers(dest="suite", required=True, parser_class=type(bench))
    in_all = _chosen("all")
    every = {**benches(), "all": None}
    for name, record in every.items():
        helptext = record.help if record else f"{', '.join(in_all)} into one run folder"
        p = bsub.add_parser(name, help=helptext)
        _add_common(p, record.iters if record else 10, record.warmup if record else 3)
        chosen = _chosen(name)
        if any(_calibrated(n) for n in chosen):
            add_profile(p)
        for n in chosen:
            if benches()[n].arguments:
                load(benches()[n].arguments)(p)


def _check_shared_options(args) -> None:
    from harness.runtime.hang import window_s

    own = benches()[args.suite].own_world_size if args.suite != "all" else None
    if own and args.world_sizes != "auto":
        raise UsageError(f"bench {args.suite} does not take --world-sizes ({args.world_sizes!r}): {own}.")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError(f"--iters must be >= 1 and --warmup >= 0; got {args.iters} and {args.warmup}.")
    window_s()  # a malformed PARITYBENCH_HANG_WINDOW_S is said before any run folder exists


def _with_calibration(args, plans: list) -> list:
    """Without --profile, a calibration sweep at the pipeline's and the 3D layouts' world sizes runs just
    before each (whose World is then already up), so their rows carry the time this machine predicts."""
    if getattr(args, "profile", None) is not None or not any(benches()[n].calibrated for n in _chosen(args.suite)):
        return plans
    from harness.cost_model.sweep import CalibrationSweep, run_sweep

    def calibrate(cfg, get_world, run):
        from harness.cost_model.build import profile_from_run

        run_sweep(cfg, get_world, run)
        profile_from_run(run.path).save(run.path / "profile.json")

    out, calibrated = [], set()
    for name, cfg, sweep in plans:
        if _calibrated(name) and tuple(cfg.world_sizes) not in calibrated:
            calibrated.add(tuple(cfg.world_sizes))
            out.append(("calibrate", CalibrationSweep(world_sizes=list(cfg.world_sizes)), calibrate))
        out.append((name, cfg, sweep))
    return out


def _check_profile(args, plans: list) -> None:
    """A --profile must answer for every world size the pipeline and 3D sweeps run (and the backend asked)."""
    if not getattr(args, "profile", None):
        return
    from harness.cost_model.profile import Profile, ProfileError

    try:
        profile = Profile.load(args.profile)
        for n in sorted({n for name, cfg, _ in plans if _calibrated(name) for n in cfg.world_sizes}):
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
        if _calibrated(name):
            cfg.profile = path


def run_plans(run, plans: list, backend: str | None, keep_going: bool = False) -> list[str]:
    """Run each (name, config, sweep) into ``run`` on Worlds made as needed and kept warm until the end (a
    World's idle ranks cost no CPU since their gloo groups share one device, and ``bench all`` returns to sizes
    2, 4 and 8 after other sizes: each respawn cost seconds), then mark the folder complete; incomplete on any
    error or interrupt. ``keep_going``: a sweep stopped by a rank's exception outside a case (a case's own
    failure is its ``failed`` row, ``harness.runtime.bench_case``; here: the calibration's, the harness's own) is named
    in one line, its rows so far kept, and the next sweep runs on fresh Worlds; returns those lines (the folder
    incomplete where there are any). The third-party stacks the sweeps name are preloaded by the fork server
    (``harness.runtime.spawn.preload_stacks``: a CPU-only torch)."""
    from harness.runtime import placement
    from harness.runtime.failures import RankFailure, verdict_of
    from harness.runtime.preload import named_in
    from harness.runtime.spawn import preload_stacks
    from harness.runtime.world import World

    worlds: dict[int, World] = {}
    preload_stacks(named_in(impl for _, cfg, _ in plans for impl in getattr(cfg, "impls", None) or ()))

    def get_world(n: int) -> World:
        if n not in worlds:
            worlds[n] = World(n, backend=backend, timeout=600)
            placement.record(run, worlds[n])
        return worlds[n]

    def close_worlds() -> None:
        for w in worlds.values():
            w.close()
        worlds.clear()

    sections: list[dict] = []
    stopped: list[str] = []
    try:
        started = time.monotonic()
        sizes = getattr(plans[0][1], "world_sizes", None)  # checkpointing runs in this process: no World
        run.update(backend=get_world(sizes[0]).backend if sizes else "none")
        for name, cfg, sweep in plans:
            section = {"section": name}
            try:
                sweep(cfg, get_world, run)
            except RankFailure as exc:
                if not keep_going:
                    raise
                section["stopped"] = line = f"bench {name} stopped (its rows so far kept): {verdict_of(exc)}"
                stopped.append(line)
                print(f"paritybench: {line}\n{exc}", file=sys.stderr, flush=True)  # the ranks' tracebacks
                close_worlds()  # a rank may be dead or stuck: the next sweep starts its own
            # wall seconds per section, the first one's World start-up included; in run.json as each ends
            sections.append({**section, "seconds": round(time.monotonic() - started, 1)})
            run.update(sections=sections)
            started = time.monotonic()
    except BaseException:
        run.finish("incomplete")
        raise
    finally:
        close_worlds()
    run.finish("incomplete" if stopped else "complete")
    return stopped


def _failed_cases(path) -> int:
    """The rows of the run's benchmarks.csv whose status is failed (``harness.runtime.bench_case``)."""
    import csv

    try:
        with open(Path(path) / "benchmarks.csv", newline="") as f:
            return sum(row.get("status") == "failed" for row in csv.DictReader(f))
    except FileNotFoundError:  # a run with no benchmark row
        return 0


def run(args) -> int:
    from dataclasses import asdict

    from harness.records.results import RunDir

    _check_shared_options(args)
    plans = [plan for name in _chosen(args.suite) for plan in load(benches()[name].plans)(args)]
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
    stopped = run_plans(run, plans, args.backend, keep_going=True)
    if not args.no_report:
        from harness.cli.report import write_report

        started = time.monotonic()
        path = write_report(run.path)
        run.update(report_seconds=round(time.monotonic() - started, 1))  # after the report: in run.json only
        print(f"paritybench: report {path} ({run.meta['report_seconds']:g} s)", file=sys.stderr)
    print(run.path)
    failed = _failed_cases(run.path)
    if failed:  # each case's verdict went to stderr as it failed; the count, last, where a user reads
        print(f"paritybench: {failed} benchmark case(s) failed — an implementation raised, a rank died or a call hung "
              "(status failed in benchmarks.csv; the report's \"Failed cases\")", file=sys.stderr)
    for line in stopped:  # again, last, where a user reads (the ranks' tracebacks went to stderr when it stopped)
        print(f"paritybench: {line}", file=sys.stderr)
    return 1 if stopped else 0
