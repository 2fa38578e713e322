"""``paritybench bench tensor_parallel``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import impls, sizes

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)


def plans(args) -> list:
    from .bench import TensorParallelSweep, run_sweep

    if min(args.hidden, args.ffn, args.seq, args.batch) < 1:
        raise UsageError("--hidden, --ffn, --seq and --batch must be >= 1.")
    cfg = TensorParallelSweep(impls=impls(args, "tensor_parallel"), world_sizes=sizes(args, args.world_sizes),
                              seq=args.seq, batch=args.batch, hidden=args.hidden, ffn=args.ffn, iters=args.iters,
                              warmup=args.warmup)
    return [("tensor_parallel", cfg, run_sweep)]
