"""``paritybench bench low_precision``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, own_or_every, variants, whole_numbers

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--lp-recipes", default="float8-tensorwise,float8-rowwise,mxfp8",
                   help="comma-separated low-precision recipes (float8-tensorwise, float8-rowwise, mxfp8)")
    p.add_argument("--lp-dims", default="256,512,512", help="tokens,K,N of the low-precision layer")


def plans(args) -> list:
    from reference.low_precision import RECIPES

    from .bench import LowPrecisionSweep, run_sweep

    recipes = variants(args.lp_recipes, "--lp-recipes", tuple(RECIPES))
    dims = whole_numbers(args.lp_dims, "--lp-dims")
    if len(dims) != 3 or any(d % 64 for d in dims):
        raise UsageError(f"--lp-dims {args.lp_dims!r} must be three multiples of 64 (tokens, K, N: MXFP8's blocks of "
                         f"32 on each of 2 TP shards).")
    iters, warmup = counts(args, "low_precision")
    cfg = LowPrecisionSweep(impls=own_or_every(args, "low_precision"), recipes=recipes, dims=tuple(dims),
                            iters=iters, warmup=warmup)
    return [("low_precision", cfg, run_sweep)]
