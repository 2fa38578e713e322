"""``paritybench localise IMPL --family F --layout DPxPPxTP [...]``: one stack case held to one device and, when it
fails, localised — its minimal configuration, first diverging tensor and shape printed, its JSON and plot written
with ``--out``. Exit 0: the case passes (or the stack does not provide it: its sentence); 1: it fails; 2: a bad
input."""

from __future__ import annotations

from harness.errors import UsageError

SIZES = {"gpt": dict(vocab=13, hidden=16, heads=8, ffn=24, layers=5),
         "llama": dict(vocab=13, hidden=16, heads=8, kv_heads=2, ffn=24, layers=5),
         "moe": dict(vocab=13, hidden=16, heads=4, kv_heads=2, ffn=8, layers=3, experts=4, top_k=2, aux_coef=0.1)}
"""The stack suite's model sizes per family (``suites/_support/stack.py``)."""


def add_parser(sub) -> None:
    p = sub.add_parser("localise", help="hold one stack case to one device; on a fail, its minimal configuration, "
                                        "first diverging tensor and the shape of the difference")
    p.add_argument("impl", help="the stack: a built-in name (reference, torch, torchtitan, ...) or pkg.mod:obj")
    p.add_argument("--family", choices=sorted(SIZES), default="gpt")
    p.add_argument("--dtype", choices=["float64", "float32", "bfloat16", "float16"], default="float64")
    p.add_argument("--layout", default="1x1x1", help="dpxppxtp")
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--tie", action="store_true", help="tie the embedding to the LM head")
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--clip", type=float, default=None, help="max global gradient norm (default: no clipping)")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="AdamW's decoupled weight decay (default 0.1; only --optimizer adamw takes one)")
    p.add_argument("--decay", choices=["all", "matrices"], default="matrices",
                   help="which parameters AdamW decays: every one, or the matrices (not the biases and norms)")
    p.add_argument("--lr-schedule", default=None, metavar="KEY=VALUE,...",
                   help="a learning-rate schedule (reference.zero.LRSchedule's fields), e.g. "
                        "warmup=1,start=0.5,decay=cosine,total=3,min_ratio=0.1")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--padded", action="store_true", help="a right-padded batch")
    p.add_argument("--budget", type=int, default=24, help="extra World calls the shrinking may spend")
    p.add_argument("--out", default=None, help="folder for the localisation's JSON and plot")


def case_of(args):
    """The ``Case`` the arguments name; a bad one is one sentence (``UsageError``)."""
    from harness.contracts.stack import Layout, Recipe
    from reference.models import ModelSpec
    from reference.zero import OptimizerSpec

    from . import Case

    try:
        dims = [int(x) for x in args.layout.lower().split("x")]
        if len(dims) != 3:
            raise ValueError
    except ValueError:
        raise UsageError(f"--layout {args.layout!r} must be dpxppxtp, e.g. 2x1x2.") from None
    if args.steps < 1 or args.budget < 0:
        raise UsageError(f"--steps must be >= 1 and --budget >= 0; got {args.steps} and {args.budget}.")
    if args.clip is not None and not args.clip > 0:  # NaN fails the comparison too
        raise UsageError(f"--clip must be a norm > 0; got {args.clip}.")
    try:
        spec = ModelSpec(args.family, dtype=args.dtype, tie_embeddings=args.tie, **SIZES[args.family])
        layout = Layout(*dims, zero=args.zero, schedule=args.schedule, checkpointing=args.checkpointing, cp=args.cp,
                        ep=args.ep)
        if args.weight_decay is not None and args.optimizer != "adamw":
            raise ValueError(f"--weight-decay is AdamW's (--optimizer adamw); {args.optimizer} takes none.")
        adamw = {"decay": args.decay, "weight_decay": 0.1 if args.weight_decay is None else args.weight_decay}
        optimizer = OptimizerSpec("sgd", 0.05) if args.optimizer == "sgd" else \
            OptimizerSpec(args.optimizer, 1e-2, eps=1e-3, **(adamw if args.optimizer == "adamw" else {}))
        recipe = Recipe(optimizer=optimizer, max_grad_norm=args.clip, accumulation=args.accumulation,
                        lr_schedule=schedule_of(args.lr_schedule))
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    return Case(spec, layout, recipe, args.steps, args.padded)


def schedule_of(text: str | None):
    """``LRSchedule`` of "key=value,..." (None: none); an unknown key or a bad value: ValueError, one sentence."""
    from dataclasses import fields

    from reference.zero import LRSchedule

    if text is None:
        return None
    kinds = {f.name: (str if f.name == "decay" else float if f.name in ("start", "min_ratio") else int)
             for f in fields(LRSchedule)}
    values = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in kinds or not value:
            raise ValueError(f"--lr-schedule takes key=value pairs of {', '.join(kinds)}; got {item!r}.")
        try:
            values[key.strip()] = kinds[key.strip()](value.strip())
        except ValueError:
            kind = "whole number" if kinds[key.strip()] is int else "number"
            raise ValueError(f"--lr-schedule's {key.strip()} must be a {kind}; got {value!r}.") from None
    return LRSchedule(**values)


def run(args) -> int:
    from harness.cli.parsing import output_path
    from harness.records import registry
    from harness.runtime.world import World
    from harness.stack.judge import judged

    from . import localise
    from .saved import save

    case = case_of(args)
    if args.out:
        output_path(args.out, "--out", folder=True)  # before the localisation: not after it
    registry.load(args.impl, "stack")  # an unknown stack: one sentence (RegistryError), before any World
    worlds: dict = {}

    def world(n):
        if n not in worlds:
            worlds[n] = World(n).__enter__()
        return worlds[n]
    try:
        v = judged(world(case.layout.world_size), args.impl, case.spec, case.layout, case.recipe,
                   one=lambda: world(1), steps=case.steps, padded=case.padded)
        if v["outcome"] != "fail":
            print(f"{v['outcome']}: {v['refused'] or 'the case holds to one device'}"
                  + (f" ({v['known'].reason})" if v["known"] else ""))
            return 0
        loc = localise(world, args.impl, case, judged, v["problems"], args.budget)
        print("\n".join(loc.lines() + v["problems"][:8]))
        if args.out:
            name = f"{args.impl}-{v['row']['collective']}"
            print(f"wrote {save(loc, args.out, name)}")
        return 1
    finally:
        for w in worlds.values():
            w.__exit__(None, None, None)
