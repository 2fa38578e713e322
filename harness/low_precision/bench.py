"""``paritybench bench low_precision``: one linear layer's call (forward + backward) per implementation, recipe and
layout over 2 ranks — the time (per iteration the max over ranks), the bytes each rank sends, counted
(``comm_count.counted_traffic``), against ``cost_model.low_precision_layer_bytes``, and the conformance verdict of the
same implementation, recipe and layout at the suite's size (``wrong``: 1 where it fails). Rows: suite
``low_precision``, ``op`` ``<recipe>/<layout>``, ``count`` the weight's elements. The layouts: FSDP with the weight
all-gathered in float32 and with the float8 all-gather (a quarter of the bytes), column + SP, row. And the baseline
the float8 all-gather is bought against: torch's FSDP2 gathering the weight in bf16 (``MixedPrecisionPolicy``,
gradients reduced in float32) — op ``bf16/fsdp``, impl ``torch``: no recipe, so no verdict — whose all-gather moves
twice the float8 one's bytes (``comm_bytes_forward``: the all-gather's, counted, against the cost model)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from harness.records import findings, registry
from harness.records.tables import NO_ROWS, not_provided, opening
from harness.runtime.bench_case import STDERR, call_case, declined, judge, problems_of
from harness.runtime.comm_count import counted_traffic
from harness.runtime.timing import summarize, time_iterations

LAYOUTS = (("fsdp", False, False), ("fsdp", False, True), ("column", True, False), ("row", False, False))
"""(kind, sp, fp8_all_gather) of each row."""
BASELINE = ("torch", "bf16")
"""(impl, recipe) of the bf16 baseline row: torch's FSDP2 with bf16 parameters, no low-precision recipe."""


@dataclass
class LowPrecisionSweep:
    impls: list[str] = field(default_factory=lambda: ["reference"])
    recipes: list[str] = field(default_factory=lambda: ["float8-tensorwise", "float8-rowwise", "mxfp8"])
    dims: tuple = (256, 512, 512)
    iters: int = 10
    warmup: int = 2
    baseline: bool = True
    """Also the bf16 FSDP2 row (torch's ``MixedPrecisionPolicy``): the all-gather the float8 one halves."""


def _bf16_fsdp(w, dp_group):
    """A bias-free linear layer holding ``w`` under torch's FSDP2 over ``dp_group``, its weight gathered in bf16 and
    its gradient reduce-scattered in float32."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from harness.runtime.rank import rank_device

    model = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        model.weight.copy_(w)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return fully_shard(model, mesh=DeviceMesh.from_group(dp_group, rank_device().type), mp_policy=policy)


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
        module = (_bf16_fsdp(w, dp_group) if (impl_spec, case.recipe) == BASELINE
                  else registry.load(impl_spec, "low_precision").shard(w, case.recipe, layout, tp_group, dp_group))
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


def run_sweep(cfg: LowPrecisionSweep, get_world, run_dir, progress=STDERR) -> int:
    from harness.runtime.world import run_or_fail
    from reference.cost_model import low_precision_layer_bytes
    from reference.low_precision import recipe as recipe_of

    from .case import as_dict, failed, run_case

    cases = list(itertools.product(cfg.impls, cfg.recipes, LAYOUTS))
    cases += [(*BASELINE, LAYOUTS[0])] if cfg.baseline else []
    for done, (impl, recipe, layout) in enumerate(cases, 1):
        baseline = (impl, recipe) == BASELINE
        case = _case(recipe, layout, cfg.dims)  # the baseline's recipe, "bf16", is no recipe: bench_rank builds it
        world = get_world(case.world)
        per_rank = call_case(world, bench_rank, impl, as_dict(case), cfg.iters, cfg.warmup)
        row = {"suite": "low_precision", "op": f"{recipe}/{case.layout().label()}", "impl": impl,
               "backend": world.backend, "world_size": case.world,
               "dtype": {"mxfp8": "mxfp8", "bf16": "bfloat16"}.get(recipe, "float8"),
               "iters": cfg.iters, "warmup": cfg.warmup, "count": case.k * case.n}
        granularity = None if baseline else recipe_of(recipe).cast("output", "w").granularity
        predicted = low_precision_layer_bytes(case.kind, granularity, case.tokens, case.k, case.n, dp=case.dp,
                                              tp=case.tp, sp=case.sp, fp8_all_gather=case.fp8_all_gather,
                                              weight_bytes=2 if baseline else 4)
        row["comm_bytes_predicted"] = predicted["forward"] + predicted["backward"]
        row["comm_bytes_forward_predicted"] = predicted["forward"]
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            row.update(status="ok", comm_bytes_measured=max(r["forward"] + r["backward"] for r in per_rank),
                       comm_bytes_forward=max(r["forward"] for r in per_rank),
                       **summarize([r["times"] for r in per_rank]))
            if not baseline:  # the suite's size: its verdict, outside the timed loop (the baseline has no recipe)
                small = _case(recipe, layout)
                verdict = run_or_fail(get_world(small.world), run_case, impl, as_dict(small), timeout=120,
                                      failed=failed)
                problems = problems_of(verdict)  # a registered finding's, named in the row (as the suite's)
                judge(row, verdict, findings.match(impl, "low_precision", problems, **small.finding_keys())
                      if problems else None)
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] low_precision {impl} {row['op']}: {extra}", file=progress, flush=True)
    return len(cases)


def low_precision_section(rows, run_dir, md) -> list[str]:
    """The report section: per implementation, recipe and layout, the call's time and bytes; the float8 all-gather's
    bytes against the bf16 baseline's."""
    ok, out = opening(rows, "## Low precision: one linear layer under float8 / MXFP8, forward + backward",
                      "A linear layer (tokens x K in, N out) under each recipe (emulated casts), over 2 ranks: FSDP "
                      "with the weight all-gathered in float32 (`fsdp`) and in float8 (`fsdp-fp8ag`: a quarter of "
                      "the bytes, plus one amax all-reduce), TP column with SP, TP row; `bf16/fsdp`: torch's FSDP2 "
                      "gathering bf16 weights, the baseline (no recipe, no verdict). Bytes: the busiest rank's, "
                      "counted, against `cost_model.low_precision_layer_bytes` (`forward`: the all-gather's under "
                      "FSDP); `wrong`: the suite's verdict of the same implementation, recipe and layout (1: it "
                      "fails).", judged=True)
    if not len(ok):
        return out + NO_ROWS
    ok = ok.copy()
    ok["ms"] = ok["time_p50_us"] / 1e3
    if "wrong" in ok.columns:  # the baseline has no verdict
        ok["wrong"] = ok["wrong"].astype(object).where(ok["wrong"].notna(), "-")
    cols = [c for c in ("impl", "op", "ms", "comm_bytes_forward", "comm_bytes_forward_predicted",
                        "comm_bytes_measured", "comm_bytes_predicted", "wrong") if c in ok.columns]
    out += [md(ok.sort_values(["impl", "op"])[cols], ".4g", index=False), ""]
    if "comm_bytes_forward" in ok.columns:
        base = ok[ok["op"] == "bf16/fsdp"]["comm_bytes_forward"]
        fp8 = ok[ok["op"].str.endswith("/fsdp-fp8ag")]
        if len(base) and len(fp8):
            out += [f"The float8 all-gather moves {base.iloc[0] / fp8['comm_bytes_forward'].max():.4g}x fewer bytes "
                    f"than the bf16 one ({int(fp8['comm_bytes_forward'].max())} vs {int(base.iloc[0])} B per call, "
                    f"its amax all-reduce included).", ""]
    return out + not_provided(rows, md, ["impl", "op", "detail"])
