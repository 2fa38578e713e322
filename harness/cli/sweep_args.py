"""What every ``paritybench bench`` sweep's options share: the implementations asked for, world sizes, whole
numbers, variants. Each paradigm's ``harness/<p>/cli.py`` builds its sweep's configuration with these; a bad
value is one sentence (``UsageError``)."""

from __future__ import annotations

import sys

from harness.cli.parsing import parse_world_sizes
from harness.errors import UsageError
from harness.records import registry


def impls(args, paradigm: str, specs: list[str] | None = None) -> list[str]:
    """``specs`` (default: --impls and --impl, or every registered implementation) that can run here."""
    if specs is None:
        specs = [s.strip() for s in args.impls.split(",") if s.strip()] if args.impls else \
            (registry.names(paradigm) if not args.impl else [])
        specs += args.impl
    runnable = []
    for spec in specs:
        try:
            impl = registry.check(spec, paradigm)
        except registry.RegistryError as exc:
            raise UsageError(str(exc)) from None
        reason = registry.skip_reason(impl)
        if reason:
            print(f"paritybench: skipping {spec}: {reason}.", file=sys.stderr)
        else:
            runnable.append(spec)
    if not runnable:
        raise UsageError(f"no {paradigm} implementation can run here (every one requested was skipped).")
    return runnable


def own_or_every(args, paradigm: str, keep=lambda impl: True) -> list[str]:
    """The implementations of a sweep: under its own sub-command those asked for (``impls``); under ``bench all``
    (whose --impls / --impl choose the collectives) every registered one that can run here and ``keep`` admits."""
    if args.suite == paradigm:
        return impls(args, paradigm)
    return [s for s in registry.names(paradigm)
            if keep(registry.resolve(s, paradigm)) and registry.skip_reason(registry.resolve(s, paradigm)) is None]


def counts(args, name: str) -> tuple[int, int]:
    """(iters, warmup) of sweep ``name``: under its own sub-command --iters and --warmup as given (their defaults its
    ``Bench`` record's); under ``bench all``, whose one --iters / --warmup every sweep shares, at most its record's
    (an 8-rank stack step costs what thousands of collectives do: the main job's budget)."""
    from harness.paradigm import benches

    if args.suite == name:
        return args.iters, args.warmup
    record = benches()[name]
    return min(args.iters, record.all_iters or record.iters), min(args.warmup, record.warmup)


def sizes(args, text: str, cpu_default: str = "2,4") -> list[int]:
    """World sizes of a sweep: as given, or ``auto`` (see ``parsing.auto_world_sizes``; benchmarks start at 2)."""
    return parse_world_sizes(text, args.backend, cpu_default, minimum=2)


def whole_numbers(text: str, flag: str) -> list[int]:
    """``--flag 1,2,4``: comma-separated whole numbers >= 1, at least one."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise UsageError(f"{flag} {text!r} must be comma-separated whole numbers >= 1.")
    return [int(t) for t in items]


def variants(text: str, flag: str, valid: tuple[str, ...]) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    if not chosen or any(v not in valid for v in chosen):
        raise UsageError(f"{flag} {text!r} must be comma-separated among {', '.join(valid)}.")
    return chosen


def layout(text: str) -> tuple[int, ...]:
    """``2x2x2`` -> (dp, pp, tp)."""
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise UsageError(f"layout {text.strip()!r} must be dpxppxtp, three whole numbers >= 1 (e.g. 2x2x2).")
    return tuple(int(p) for p in parts)


def add_profile(p) -> None:
    p.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="predict each step with this machine profile (default: calibrate first, into this "
                        "run folder: calibration.csv and profile.json)")
