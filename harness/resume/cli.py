"""``paritybench bench resume``: its sweep (the shared options only)."""

from __future__ import annotations

from harness.cli.sweep_args import sizes


def plans(args) -> list:
    from .bench import ResumeSweep, run_sweep

    cfg = ResumeSweep(world_sizes=sizes(args, args.world_sizes), iters=min(args.iters, 3), warmup=min(args.warmup, 1))
    return [("resume", cfg, run_sweep)]
