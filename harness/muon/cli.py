"""``paritybench bench muon``: its options and its sweep."""

from __future__ import annotations

from harness.cli.sweep_args import counts, own_or_every, sizes, variants, whole_numbers

from ..errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--muon-layouts", default="replicated,rows,cols,flat",
                   help="comma-separated Muon layouts (replicated, rows, cols, flat)")
    p.add_argument("--muon-hidden", default="128", help="the Muon model's width (a multiple of 4)")


def plans(args) -> list:
    from reference.muon import LAYOUTS

    from .bench import MuonSweep, run_sweep

    layouts = variants(args.muon_layouts, "--muon-layouts", LAYOUTS)
    (hidden, *rest) = whole_numbers(args.muon_hidden, "--muon-hidden")
    if rest or hidden % 4:
        raise UsageError(f"--muon-hidden {args.muon_hidden!r} must be one multiple of 4 (k and v are h / 2 rows, "
                         f"the MLP 3h / 2).")
    iters, warmup = counts(args, "muon")
    cfg = MuonSweep(impls=own_or_every(args, "muon"), layouts=layouts, world_sizes=sizes(args, args.world_sizes),
                    hidden=hidden, iters=iters, warmup=warmup)
    return [("muon", cfg, run_sweep)]
