"""``paritybench bench zero`` (and its section of ``bench all``): its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, own_or_every, sizes, variants

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--stages", default="0,1,2,3", help="ZeRO stages (0: plain data parallelism)")
    p.add_argument("--zero-world-sizes", default=None, help="DP sizes (default: --world-sizes)")
    p.add_argument("--zero-hidden", type=int, default=256, help="transformer block width")
    p.add_argument("--zero-variants", default="plain,bf16,clip,hybrid",
                   help="plain; bf16 (the reference in mixed precision); clip (every implementation "
                        "clipping at 1.0, at the largest DP size); hybrid (every implementation over a 2 x N/2 "
                        "hybrid-sharded mesh, stages 1-3, at the largest DP size)")


def config(args):
    from .bench import VARIANTS, ZeroSweep

    stages = [t.strip() for t in args.stages.split(",") if t.strip()]
    if not stages or any(t not in ("0", "1", "2", "3") for t in stages):
        raise UsageError(f"--stages {args.stages!r} must be comma-separated ZeRO stages among 0, 1, 2, 3.")
    if args.zero_hidden < 1:
        raise UsageError(f"--zero-hidden must be >= 1; got {args.zero_hidden}.")
    chosen = variants(args.zero_variants, "--zero-variants", VARIANTS)
    impls = own_or_every(args, "zero", keep=lambda impl: not impl.only_ops)
    iters, warmup = counts(args, "zero")
    return ZeroSweep(impls=impls, world_sizes=sizes(args, args.zero_world_sizes or args.world_sizes),
                     stages=[int(t) for t in stages], hidden=args.zero_hidden, iters=iters, warmup=warmup,
                     variants=chosen)


def plans(args) -> list:
    from .bench import run_sweep

    return [("zero", config(args), run_sweep)]
