"""``paritybench calibrate [--from RUN_DIR] --out PROFILE.json``: fit a machine profile.

Without --from it runs the calibration sweep (``sweep``) into a new run folder first (its rows stay there:
``--from`` that folder refits them), then fits and writes the profile, and prints each fit with its error.
"""

from __future__ import annotations

import sys

from harness.cost_model.profile import ProfileError
from harness.errors import UsageError

DEFAULT_CPU_SIZES = "2,4,8"


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a machine profile (α–β per collective, point-to-point, FLOP/s) "
                                         "for 'plan --profile'")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--from", dest="from_run", default=None, metavar="RUN_DIR",
                   help="fit from this run folder's measurements instead of running the sweep")
    p.add_argument("--world-sizes", default="auto",
                   help=f"ranks busy at once, comma-separated, or auto ({DEFAULT_CPU_SIZES} on CPU; on a GPU node "
                        "as bench's auto)")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"])
    p.add_argument("--dtypes", default="float32", help="dtypes of the matmul rate (float32, bfloat16, float16)")
    p.add_argument("--iters", type=int, default=6, help="timed samples per point (each a burst of 5)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--results-dir", default="results/runs")


def sweep_config(args, world_sizes: list[int] | None = None):
    from harness.cli.parsing import parse_list, parse_world_sizes
    from harness.cost_model.sweep import CalibrationSweep

    if args.iters < 2 or args.warmup < 0:
        raise UsageError(f"--iters must be >= 2 and --warmup >= 0; got {args.iters} and {args.warmup}.")
    sizes = world_sizes or parse_world_sizes(args.world_sizes, args.backend, DEFAULT_CPU_SIZES, minimum=2)
    dtypes = parse_list(getattr(args, "dtypes", "float32"), ("float32", "bfloat16", "float16", "float64"), "dtype(s)")
    return CalibrationSweep(world_sizes=sizes, dtypes=dtypes, iters=args.iters, warmup=args.warmup)


def fit_table(profile) -> str:
    lines = [f"profile: backend {profile.backend}, world sizes {', '.join(map(str, profile.world_sizes))}, "
             f"host {profile.host.get('cpu')} ({profile.host.get('cores')} cores, {profile.host.get('device')})",
             f"{'what':34s} {'alpha us':>10s} {'beta GB/s':>10s} {'median err':>10s} {'max err':>8s}"]
    for e in profile.collectives + profile.p2p:
        what = (f"{e['op']} g={e['group_size']} of {e['world_size']}" if "op" in e
                else f"p2p {e['what']} ({e['world_size']} ranks)")
        bw = 1 / e["beta_s_per_byte"] / 1e9 if e["beta_s_per_byte"] > 0 else float("inf")
        lines.append(f"{what:34s} {e['alpha_s'] * 1e6:10.1f} {bw:10.3f} {e['median_rel_error']:10.1%} "
                     f"{e['max_rel_error']:8.1%}")
    for e in profile.compute:
        extra = f", {e['overhead_s'] * 1e3:.2f} ms per layer beyond its GEMMs" if "overhead_s" in e else ""
        lines.append(f"{e['dtype']} {e['kind']}, {e['world_size']} ranks busy: {e['flops_per_s'] / 1e9:.2f} GFLOP/s "
                     f"per rank{extra}")
    return "\n".join(lines)


def run(args) -> int:
    from harness.cli.parsing import output_path
    from harness.cost_model.build import profile_from_run

    output_path(args.out, "--out")  # before the sweep: not after its minutes
    if args.from_run:
        try:
            profile = profile_from_run(args.from_run)
        except ProfileError as exc:
            raise UsageError(str(exc)) from None
    else:
        profile = calibrate_into_new_run(args)
    path = profile.save(args.out)
    print(fit_table(profile))
    print(f"paritybench: profile {path}", file=sys.stderr)
    return 0


def calibrate_into_new_run(args):
    from harness.cli.bench import run_plans
    from harness.cost_model.build import profile_from_run
    from harness.cost_model.sweep import run_sweep
    from harness.records.results import RunDir

    cfg = sweep_config(args)
    run = RunDir(args.results_dir, {"suite": "calibrate", "calibration": [vars(cfg)]})
    print(f"paritybench: run folder {run.path}", file=sys.stderr)
    run_plans(run, [("calibrate", cfg, run_sweep)], args.backend)
    profile = profile_from_run(run.path)
    profile.save(run.path / "profile.json")
    return profile
