"""``paritybench bench collectives`` (and ``bench all``'s first section): its options and its sweep."""

from __future__ import annotations

from harness.cli.parsing import parse_bytes, parse_list
from harness.cli.sweep_args import impls, sizes

from ..errors import UsageError
from .case import COLLECTIVES, DTYPES, OPS


def add_arguments(p) -> None:
    p.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated collectives")
    p.add_argument("--min-bytes", default="1K")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--factor", type=int, default=4, help="size multiplier between steps (>= 2)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--reduce-op", default="sum", choices=OPS)


def config(args):
    from .bench import SweepConfig

    cfg = SweepConfig(
        impls=impls(args, "collectives"), ops=parse_list(args.ops, COLLECTIVES, "collective(s)"),
        world_sizes=sizes(args, args.world_sizes), min_bytes=parse_bytes(args.min_bytes),
        max_bytes=parse_bytes(args.max_bytes), factor=args.factor, iters=args.iters, warmup=args.warmup,
        dtype=args.dtype, reduce_op=args.reduce_op)
    if cfg.min_bytes < 1 or cfg.min_bytes > cfg.max_bytes:
        raise UsageError(f"--min-bytes ({cfg.min_bytes}) must be at least 1 and at most --max-bytes ({cfg.max_bytes}).")
    if cfg.factor < 2:
        raise UsageError(f"--factor must be a whole number of at least 2; got {cfg.factor}.")
    return cfg


def plans(args) -> list:
    from .bench import run_sweep

    return [("collectives", config(args), run_sweep)]
