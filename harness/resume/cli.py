"""``paritybench bench resume``: its sweep (the shared options only)."""

from __future__ import annotations

from harness.cli.sweep_args import counts, sizes


def plans(args) -> list:
    from .bench import ResumeSweep, run_sweep

    iters, warmup = counts(args, "resume")
    cfg = ResumeSweep(world_sizes=sizes(args, args.world_sizes), iters=iters, warmup=warmup)
    return [("resume", cfg, run_sweep)]
