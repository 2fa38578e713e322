"""``paritybench bench 3d``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, variants

from ..contracts.stack import SCHEDULES
from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--3d-world-size", dest="threed_world_size", type=int, default=8,
                   help="ranks of the 3D layouts (8 on 2 cores: oversubscribed, compare layouts only)")
    p.add_argument("--3d-schedule", dest="threed_schedule", default="1f1b", choices=SCHEDULES)
    p.add_argument("--3d-zero", dest="threed_zero", type=int, default=1, choices=[0, 1, 2])
    p.add_argument("--3d-checkpointing", dest="threed_checkpointing", action="store_true")
    p.add_argument("--3d-variants", dest="threed_variants", default="plain",
                   help="comma-separated among plain, bf16 (bfloat16 with fp32 masters), clip (global "
                        "gradient-norm clipping at 1.0); opt-in: each adds one run of every layout")


def config(args):
    from .bench import VARIANTS, ThreeDSweep, valid_layouts

    if args.threed_world_size < 1:
        raise UsageError(f"--3d-world-size must be >= 1; got {args.threed_world_size}.")
    if args.impls or args.impl:
        raise UsageError("bench 3d measures the reference stack's GPT only: it takes no --impls / --impl (bench stack "
                         "sweeps the layouts of any stack).")
    chosen = variants(args.threed_variants, "--3d-variants", VARIANTS)
    iters, warmup = counts(args, "3d")
    cfg = ThreeDSweep(world_size=args.threed_world_size, schedule=args.threed_schedule, zero_stage=args.threed_zero,
                      checkpointing=args.threed_checkpointing, iters=iters, warmup=warmup,
                      variants=chosen)
    if not valid_layouts(cfg):
        raise UsageError(f"no dp x pp x tp layout of {cfg.world_size} ranks fits the model ({cfg.heads} heads, "
                         f"{cfg.layers} layers).")
    return cfg


def plans(args) -> list:
    from .bench import run_sweep

    return [("3d", config(args), run_sweep)]
