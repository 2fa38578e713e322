"""``paritybench bench low_precision``: one linear layer's call (forward + backward) per implementation, recipe and
layout over 2 ranks — the time (per iteration the max over ranks), the bytes each rank sends, counted
(``comm_count.counted_traffic``), against ``cost_model.low_precision_layer_bytes``, and the conformance verdict of the
same implementation, recipe and layout at the suite's size (``wrong``: 1 where it fails). Rows: suite
``low_precision``, ``op`` ``<recipe>/<layout>``, ``count`` the weight's elements. The layouts: FSDP with the weight
all-gathered in float32 and with the float8 all-gather (a quarter of the bytes), column + SP, row."""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field

from harness.records import registry
from harness.records.tables import NO_ROWS, opening
from harness.runtime.comm_count import counted_traffic
from harness.runtime.timing import summarize, time_iterations

LAYOUTS = (("fsdp", False, False), ("fsdp", False, True), ("column", True, False), ("row", False, False))
"""(kind, sp, fp8_all_gather) of each row."""


@dataclass
class LowPrecisionSweep:
    impls: list[str] = field(default_factory=lambda: ["reference"])
    recipes: list[str] = field(default_factory=lambda: ["float8-tensorwise", "float8-rowwise", "mxfp8"])
    dims: tuple = (256, 512, 512)
    iters: int = 10
    warmup: int = 2


def _case(recipe: str, layout: tuple, dims: tuple | None = None):
    from .case import Case

    kind, sp, fp8 = layout
    dp, tp = (2, 1) if kind == "fsdp" else (1, 2)
    extra = dict(zip(("tokens", "k", "n"), dims, strict=True)) if dims else {}
    return Case(recipe=recipe, kind=kind, sp=sp, fp8_all_gather=fp8, dp=dp, tp=tp, **extra)


def bench_rank(impl_spec: str, case_dict: dict, iters: int, warmup: int) -> dict:
    import torch.distributed as dist

    from harness.runtime.rank import rank_device
    from reference.low_precision import local_part

    from .case import Case, groups, inputs

    case = Case(**case_dict)
    tp_group, dp_group = groups(case.dp, case.tp)
    r = dist.get_rank()
    x_all, w, g_all = inputs(case)
    layout = case.layout()
    x = local_part(x_all[: case.tokens], "x", layout, case.tp, r % case.tp).clone().requires_grad_()
    g = local_part(g_all[: case.tokens], "g", layout, case.tp, r % case.tp)
    try:
        module = registry.load(impl_spec, "low_precision").shard(w, case.recipe, layout, tp_group, dp_group)
        forward, backward = [0.0], [0.0]
        with counted_traffic(forward):
            y = module(x)
        with counted_traffic(backward):
            y.backward(g.to(y.dtype))
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc).splitlines()[0]}

    def step():
        module(x).backward(g.to(y.dtype))
    return {"times": time_iterations(step, iters, warmup, rank_device()), "forward": forward[0],
            "backward": backward[0]}


def run_sweep(cfg: LowPrecisionSweep, get_world, run_dir, progress=sys.stderr) -> int:
    from harness.runtime.world import run_or_fail
    from reference.cost_model import low_precision_layer_bytes
    from reference.low_precision import recipe as recipe_of

    from .case import as_dict, failed, run_case

    cases = list(itertools.product(cfg.impls, cfg.recipes, LAYOUTS))
    for done, (impl, recipe, layout) in enumerate(cases, 1):
        case = _case(recipe, layout, cfg.dims)
        world = get_world(case.world)
        per_rank = world.run(bench_rank, impl, as_dict(case), cfg.iters, cfg.warmup, timeout=600)
        row = {"suite": "low_precision", "op": f"{recipe}/{case.layout().label()}", "impl": impl,
               "backend": world.backend, "world_size": case.world, "dtype": "float8" if recipe != "mxfp8" else "mxfp8",
               "iters": cfg.iters, "warmup": cfg.warmup, "count": case.k * case.n}
        granularity = recipe_of(recipe).cast("output", "w").granularity
        predicted = low_precision_layer_bytes(case.kind, granularity, case.tokens, case.k, case.n, dp=case.dp,
                                              tp=case.tp, sp=case.sp, fp8_all_gather=case.fp8_all_gather)
        row["comm_bytes_predicted"] = predicted["forward"] + predicted["backward"]
        unsupported = [r["unsupported"] for r in per_rank if "unsupported" in r]
        if unsupported:
            row.update(status="unsupported", detail=unsupported[0])
        else:
            small = _case(recipe, layout)  # the suite's size: its verdict, outside the timed loop
            verdict = run_or_fail(get_world(small.world), run_case, impl, as_dict(small), timeout=120, failed=failed)
            row.update(status="ok", comm_bytes_measured=max(r["forward"] + r["backward"] for r in per_rank),
                       wrong=int(any(r.get("problems") for r in verdict)), **summarize([r["times"] for r in per_rank]))
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] low_precision {impl} {row['op']}: {extra}", file=progress, flush=True)
    return len(cases)


def low_precision_section(rows, run_dir, md) -> list[str]:
    """The report section: per implementation, recipe and layout, the call's time and bytes."""
    ok, out = opening(rows, "## Low precision: one linear layer under float8 / MXFP8, forward + backward",
                      "A linear layer (tokens x K in, N out) under each recipe (emulated casts), over 2 ranks: FSDP "
                      "with the weight all-gathered in float32 (`fsdp`) and in float8 (`fsdp-fp8ag`: a quarter of "
                      "the bytes, plus one amax all-reduce), TP column with SP, TP row. Bytes: the busiest rank's, "
                      "counted, against `cost_model.low_precision_layer_bytes`; `wrong`: the suite's verdict of the "
                      "same implementation, recipe and layout (1: it fails).")
    if not len(ok):
        return out + NO_ROWS
    ok["ms"] = ok["time_p50_us"] / 1e3
    cols = ["impl", "op", "ms", "comm_bytes_measured", "comm_bytes_predicted", "wrong"]
    out += [md(ok.sort_values(["impl", "op"])[cols], ".4g", index=False), ""]
    missing = rows[rows["status"] == "unsupported"]
    if len(missing):
        out += [md(missing[["impl", "op", "detail"]], "g", index=False), ""]
    return out
