"""``paritybench bench stack`` and ``bench matrix`` (and their sections of ``bench all``): options and sweeps."""

from __future__ import annotations

from harness.cli.parsing import parse_list
from harness.cli.sweep_args import counts, impls, layout, own_or_every, sizes

from ..contracts.stack import SCHEDULES
from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--families", default=None,
                   help="comma-separated among gpt, llama (default: both; bench all: llama, to keep the main job "
                        "in its 10 minutes on 2 cores)")
    p.add_argument("--stack-world-size", dest="stack_world_size", type=int, default=8,
                   help="ranks of the layouts (8 on 2 cores: oversubscribed, compare layouts only)")
    p.add_argument("--stack-schedule", dest="stack_schedule", default="1f1b", choices=SCHEDULES)
    p.add_argument("--stack-zero", dest="stack_zero", type=int, default=2, choices=[0, 1, 2, 3],
                   help="ZeRO stage over dp (2: what every stack here shards; FSDP2 is 2 or 3)")
    p.add_argument("--stack-optimizer", dest="stack_optimizer", default="sgd", choices=["sgd", "adam", "adamw"],
                   help="the stacks' optimizer (adam: the one every stack here trains; adamw: weight decay 0.1, the "
                        "biases and norms spared)")
    p.add_argument("--stack-layouts", dest="stack_layouts", default=None,
                   help="comma-separated dpxppxtp layouts (default: every one the model allows)")


def config(args):
    from .bench import FAMILIES, StackSweep, valid_layouts

    if args.stack_world_size < 1:
        raise UsageError(f"--stack-world-size must be >= 1; got {args.stack_world_size}.")
    families = args.families or ("llama" if args.suite == "all" else ",".join(FAMILIES))
    iters, warmup = counts(args, "stack")
    cfg = StackSweep(impls=[], families=parse_list(families, FAMILIES, "famil(ies)"),
                     world_size=args.stack_world_size, schedule=args.stack_schedule, zero_stage=args.stack_zero,
                     optimizer=args.stack_optimizer, iters=iters, warmup=warmup)
    allowed = valid_layouts(cfg)
    if args.stack_layouts:
        cfg.layouts = [layout(t) for t in args.stack_layouts.split(",") if t.strip()]
        bad = [d for d in cfg.layouts if d not in allowed]
        if bad or not cfg.layouts:
            raise UsageError(f"--stack-layouts {args.stack_layouts!r}: each must be dpxppxtp of {cfg.world_size} ranks "
                             f"that the model allows ({', '.join('x'.join(map(str, d)) for d in allowed)}).")
    if not allowed:
        raise UsageError(f"no dp x pp x tp layout of {cfg.world_size} ranks fits the model ({cfg.heads} heads, "
                         f"{cfg.layers} layers).")
    # the implementations last: a bad argument is the only line, not after a "skipping ..." for each missing stack
    cfg.impls = own_or_every(args, "stack")
    return cfg


def plans(args) -> list:
    """The stack sweep; under ``bench all`` the installed third parties beside ours, each at the ZeRO stage it
    shards with."""
    from .bench import run_sweep, third_party_sweeps

    cfg = config(args)
    extra = third_party_sweeps(cfg, cfg.impls) if args.suite == "all" else []
    return [("stack", c, run_sweep) for c in [cfg, *extra]]


def matrix_plans(args) -> list:
    """The matrix's fixed cases; ``bench matrix --world-sizes N,...`` only those of these sizes (``bench all``'s
    world sizes are its sweeps': the matrix there runs every case)."""
    from .matrix import MatrixSweep, run_sweep

    if args.suite != "matrix":
        return [("matrix", MatrixSweep(), run_sweep)]
    chosen = [] if args.world_sizes == "auto" else sizes(args, args.world_sizes)
    if not MatrixSweep(sizes=chosen).world_sizes:  # said before the stacks are resolved: the error is the only line
        raise UsageError(f"no case of the matrix runs at --world-sizes {args.world_sizes!r}; its cases run at "
                         f"{', '.join(map(str, MatrixSweep().world_sizes))} ranks.")
    return [("matrix", MatrixSweep(impls=impls(args, "stack"), sizes=chosen), run_sweep)]

