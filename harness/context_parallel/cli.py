"""``paritybench bench context_parallel``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, impls, sizes, whole_numbers

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--seqs", default="256,1024,2048", help="comma-separated sequence lengths")


def plans(args) -> list:
    from .bench import ContextParallelSweep, run_sweep

    seqs = whole_numbers(args.seqs, "--seqs")
    world_sizes = sizes(args, args.world_sizes)
    bad = [s for s in seqs for n in world_sizes if s % (2 * n)]
    if bad:  # checked before the implementations are resolved: the error is the only line
        raise UsageError(f"--seqs: {bad[0]} tokens do not split into the 2 cp chunks the zigzag layout needs at "
                         f"every --world-sizes cp ({', '.join(map(str, world_sizes))}).")
    iters, warmup = counts(args, "context_parallel")
    cfg = ContextParallelSweep(impls=impls(args, "context_parallel"), world_sizes=world_sizes, seqs=seqs,
                               iters=iters, warmup=warmup)
    return [("context_parallel", cfg, run_sweep)]
