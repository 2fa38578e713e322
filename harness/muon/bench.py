"""``paritybench bench muon``: one optimizer step (Muon for the matrices, AdamW for the rest) per implementation,
layout and world size — the time (per iteration the max over ranks), the bytes each rank sends, counted
(``comm_count.counted_traffic``), against ``cost_model.muon_step_bytes`` (the reference's gathers; torch's DTensor
redistributions are measured only), and the suite's verdict of the same implementation and layout at its size
(``wrong``: 1 where it fails). Rows: suite ``muon``, ``op`` ``<layout>/<fused|split>``, ``count`` the Muon matrices'
elements. Replicated is the baseline: Muon's price under sharding is the other rows' bytes and time over it."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.records.tables import NO_ROWS, not_provided, opening
from harness.runtime.bench_case import STDERR, call_case, declined, judge
from harness.runtime.comm_count import counted_traffic
from harness.runtime.timing import summarize, time_iterations


@dataclass
class MuonSweep:
    impls: list[str] = field(default_factory=lambda: ["reference"])
    layouts: list[str] = field(default_factory=lambda: ["replicated", "rows", "cols", "flat"])
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    hidden: int = 128
    iters: int = 10
    warmup: int = 2


def bench_rank(impl_spec: str, case_dict: dict, iters: int, warmup: int) -> dict:
    import torch.distributed as dist

    from harness.runtime.rank import rank_device
    from reference.muon import local_part

    from .case import Case, inputs

    case = Case(**case_dict)
    r, n = dist.get_rank(), dist.get_world_size()
    params, grads = inputs(case)
    impl = registry.load(impl_spec, "muon")
    try:
        opt = impl.shard(params, case.spec(), case.layout, dist.group.WORLD)
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc).splitlines()[0]}
    local = local_part(grads[0], case.layout, r, n)
    sent = [0.0]
    with collective_calls() as calls, counted_traffic(sent):
        impl.step(opt, local)
    return {"times": time_iterations(lambda: impl.step(opt, local), iters, warmup, rank_device()), "sent": sent[0],
            "calls": calls()}


@contextlib.contextmanager
def collective_calls():
    """Yields a function returning {collective: calls} DTensor issued within the block (torch's public
    ``CommDebugMode``): DTensor's redistributions inside an optimizer step reach no byte counter here, so a row
    whose counted bytes are 0 while DTensor issued collectives says so instead of reporting 0."""
    try:
        from torch.distributed.tensor.debug import CommDebugMode
    except ImportError:  # an older torch: no calls seen, the bytes stand as counted
        yield dict
        return
    mode = CommDebugMode()
    with mode:
        yield lambda: {getattr(op, "__name__", str(op)): int(c) for op, c in mode.get_comm_counts().items()}


def run_sweep(cfg: MuonSweep, get_world, run_dir, progress=STDERR) -> int:
    from harness.runtime.world import run_or_fail
    from reference.cost_model import muon_step_bytes
    from reference.muon.sharded import owned

    from .case import Case, as_dict, failed, run_case, shapes

    cases = [(impl, layout, n, fused) for impl, layout, n in itertools.product(cfg.impls, cfg.layouts, cfg.world_sizes)
             for fused in ((True, False) if impl == "reference" else (False,))]
    for done, (impl, layout, n, fused) in enumerate(cases, 1):
        case = Case(layout, n, fused=fused, steps=1, hidden=cfg.hidden)
        world = get_world(n)
        per_rank = call_case(world, bench_rank, impl, as_dict(case), cfg.iters, cfg.warmup)
        spec, sizes = case.spec(), shapes(case)
        muon = {k: s for k, s in sizes.items() if spec.takes(k, s)}
        row = {"suite": "muon", "op": f"{layout}/{'fused' if fused else 'split'}", "impl": impl,
               "backend": world.backend, "world_size": n, "dtype": "float32", "iters": cfg.iters,
               "warmup": cfg.warmup, "count": sum(a * b for a, b in muon.values())}
        if impl == "reference":
            parts = {k: [len(idx) for idx, _ in per] for k, per in owned(sizes, layout, n).items() if k in muon}
            row["comm_bytes_predicted"] = muon_step_bytes(parts, layout, n)
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            small = Case(layout, n, fused=fused)  # the suite's size: its verdict, outside the timed loop
            verdict = run_or_fail(get_world(n), run_case, impl, as_dict(small), timeout=120, failed=failed)
            row.update(status="ok", comm_bytes_measured=max(x["sent"] for x in per_rank),
                       **summarize([x["times"] for x in per_rank]))
            calls = per_rank[0]["calls"]
            if row["comm_bytes_measured"] == 0 and calls:  # collectives the counter did not see: no byte figure
                row["comm_bytes_measured"] = None
                row["detail"] = "DTensor collectives per step, bytes not counted: " + ", ".join(
                    f"{c} {op}" for op, c in sorted(calls.items()))
            judge(row, verdict)
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] muon {impl} {row['op']} n={n}: {extra}", file=progress, flush=True)
    return len(cases)


def muon_section(rows, run_dir, md) -> list[str]:
    """The report section: per implementation, layout and world size, one step's time and bytes."""
    ok, out = opening(rows, "## Muon: one optimizer step under sharding",
                      "Muon for a model's hidden matrices (fused QKV and gate + up orthogonalised per part, or split), "
                      "AdamW for the rest, one step: time (p50 over iterations of the slowest rank) and the bytes the "
                      "busiest rank sends, counted, against `cost_model.muon_step_bytes` (the reference's all-gather "
                      "of each matrix's update; torch's DTensor redistributions measured only). `replicated` sends "
                      "nothing: the other rows are Muon's price under sharding. `wrong`: the suite's verdict.",
                      judged=True)
    if not len(ok):
        return out + NO_ROWS
    ok["ms"] = ok["time_p50_us"] / 1e3
    cols = [c for c in ("impl", "op", "world_size", "ms", "comm_bytes_measured", "comm_bytes_predicted", "wrong")
            if c in ok.columns]
    out += [md(ok.sort_values(["impl", "world_size", "op"])[cols], ".4g", index=False), ""]
    uncounted = ok[ok["comm_bytes_measured"].isna()] if "detail" in ok.columns else ok.iloc[:0]
    if len(uncounted):
        out += ["Rows without bytes: DTensor issued the step's collectives where no byte counter sees them (inside "
                "torch's optimizer step); their calls, from torch's `CommDebugMode`:", "",
                md(uncounted[["impl", "op", "world_size", "detail"]], "g", index=False), ""]
    return out + not_provided(rows, md, ["impl", "op", "world_size", "detail"])
