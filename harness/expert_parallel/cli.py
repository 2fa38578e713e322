"""``paritybench bench expert_parallel``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, impls, sizes, whole_numbers

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--tokens", default="256,1024", help="comma-separated tokens per rank")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", dest="top_k", type=int, default=2)


def ep_impls(args) -> list[str]:
    """The sweep's implementations: ``impls``'s, with the installed third-party MoE layers (the record's
    ``third_party``) beside them where none is named (``--impls`` / ``--impl`` may name those too)."""
    from .bench import installed_third_parties, third_parties

    named = [s.strip() for s in (args.impls or "").split(",") if s.strip()] + list(args.impl)
    known = third_parties()
    third = [s for s in named if s in known]
    for spec in third:
        if spec not in installed_third_parties():
            raise UsageError(f"{spec} needs {', '.join(known[spec].requires)}, which is not installed.")
    if not named:
        return impls(args, "expert_parallel") + installed_third_parties()
    rest = [s for s in named if s not in known]
    return (impls(args, "expert_parallel", rest) if rest else []) + third


def plans(args) -> list:
    from .bench import ExpertParallelSweep, run_sweep

    tokens = whole_numbers(args.tokens, "--tokens")
    world_sizes = sizes(args, args.world_sizes)
    if args.experts < 1 or not 1 <= args.top_k <= args.experts:
        raise UsageError(f"--experts must be >= 1 and --top-k between 1 and it; got {args.experts} and {args.top_k}.")
    bad = [n for n in world_sizes if args.experts % n or args.top_k > args.experts // n]
    if bad:  # the skewed router sends every token to EP rank 0's E / ep experts: k of them must exist
        raise UsageError(f"--experts ({args.experts}) must split over every --world-sizes ep into at least "
                         f"--top-k ({args.top_k}) per rank; ep = {bad[0]} does not.")
    iters, warmup = counts(args, "expert_parallel")
    cfg = ExpertParallelSweep(impls=ep_impls(args), world_sizes=world_sizes, tokens=tokens, experts=args.experts,
                              top_k=args.top_k, iters=iters, warmup=warmup)
    return [("expert_parallel", cfg, run_sweep)]
