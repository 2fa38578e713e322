"""``paritybench bench resume``: its sweeps (the shared options only): the reference stack's save and load, or
those of each stack --impls / --impl name (through the stack contract), one sweep each."""

from __future__ import annotations

from harness.cli.sweep_args import counts, impls, sizes


def plans(args) -> list:
    from .bench import ResumeSweep, run_sweep

    iters, warmup = counts(args, "resume")
    world_sizes = sizes(args, args.world_sizes)
    chosen = impls(args, "stack") if args.impls or args.impl else ["reference"]
    return [("resume", ResumeSweep(world_sizes=world_sizes, iters=iters, warmup=warmup, impl=impl), run_sweep)
            for impl in chosen]
