"""``paritybench bench pipeline`` (and its section of ``bench all``): its options and its sweep."""

from __future__ import annotations

from harness.cli.parsing import parse_list
from harness.cli.sweep_args import counts, own_or_every, sizes, whole_numbers
from reference.pipeline import GENERATORS

from ..errors import UsageError

SCHEDULES = tuple(GENERATORS)


def add_arguments(p) -> None:
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--pipeline-world-sizes", default="auto",
                   help="pipeline ranks p, or auto (2 on CPU: 2 cores; on a GPU node as --world-sizes)")
    p.add_argument("--microbatches", default="2,4,8")
    p.add_argument("--wide-microbatches", default=None,
                   help="microbatches at pipeline sizes above 2 (default: --microbatches)")
    p.add_argument("--virtual-stages", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)


def config(args):
    from .bench import PipelineSweep

    given = args.pipeline_world_sizes if args.suite == "all" else args.world_sizes
    micro = whole_numbers(args.microbatches, "--microbatches")
    wide = whole_numbers(args.wide_microbatches, "--wide-microbatches") if args.wide_microbatches else None
    if args.virtual_stages < 1 or args.hidden < 1:
        raise UsageError(f"--virtual-stages and --hidden must be >= 1; got {args.virtual_stages}, {args.hidden}.")
    iters, warmup = counts(args, "pipeline")  # under bench all at most its own 5 / 2 (it took bench all's 10)
    return PipelineSweep(impls=own_or_every(args, "pipeline"),
                         schedules=parse_list(args.schedules, SCHEDULES, "schedule(s)"),
                         world_sizes=sizes(args, given, "2"), microbatches=micro, wide_microbatches=wide,
                         virtual_stages=args.virtual_stages, hidden=args.hidden, iters=iters, warmup=warmup)


def plans(args) -> list:
    from .bench import run_sweep

    return [("pipeline", config(args), run_sweep)]
