"""``paritybench bench checkpoint`` (and its section of ``bench all``): its options and its sweep."""

from __future__ import annotations

from harness.cli.parsing import parse_list
from harness.cli.sweep_args import own_or_every, whole_numbers


def add_arguments(p) -> None:
    p.add_argument("--layers", default="4,16,64", help="layer counts L of the checkpointed stack")
    p.add_argument("--policies", default="layer,sqrt", help="checkpointing policies")


def config(args):
    from ..contracts.checkpoint import POLICIES
    from .bench import CheckpointSweep

    layers = whole_numbers(args.layers, "--layers")
    return CheckpointSweep(impls=own_or_every(args, "checkpoint"), layers=layers,
                           policies=parse_list(args.policies, POLICIES, "polic(ies)"), iters=args.iters,
                           warmup=args.warmup)


def plans(args) -> list:
    from .bench import run_sweep

    return [("checkpoint", config(args), run_sweep)]
