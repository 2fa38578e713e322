"""``paritybench bench expert_parallel``: one MoE layer's forward + backward per implementation against ep,
the tokens per rank and the routing's skew — the time (per iteration the max over ranks), the forward's
dispatch + combine time on its own (``dispatch_p50_us``: the forward with every expert an identity, so
what is left is routing, the all-to-alls and the combine), and the bytes each rank sends, counted
(``comm_count.counted_traffic``), against ``cost_model.ep_layer_comm_bytes`` of the routing the layer saw
plus the load-balancing loss's three all-reduces (exact), and ``balanced_ep_bytes`` (the balanced-routing
model the planner uses). ``skew``: every token routed to EP rank 0's experts (``harness.expert_parallel.
case``'s skewed router): rank 0 computes every token, the others none. Rows: suite ``expert_parallel``,
``op`` ``E<experts>k<k>/T<tokens>[-skew]``, ``count`` the tokens per rank, ``world_size`` ep. The one-device
layer on one rank's share of the tokens is timed too (``impl`` ``one-device``, world size 1).

On 2 CPU cores, 4 ranks are oversubscribed: compare skews and token counts at one ep, not ep sizes."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

from harness.records import registry
from harness.records.tables import NO_ROWS, not_provided, opening
from harness.runtime.bench_case import STDERR, call_case, declined
from harness.runtime.comm_count import counted_traffic
from harness.runtime.timing import summarize, time_iterations


def third_parties() -> dict:
    """name -> ``registry.ImplSpec`` of the third-party MoE layers the sweep times beside the registered
    implementations where installed (``PARADIGM.third_party``: why they are not held through the contract)."""
    from . import PARADIGM

    return {spec.name: spec for spec in PARADIGM.third_party}


def installed_third_parties() -> list[str]:
    return [name for name, spec in third_parties().items() if registry.skip_reason(spec) is None]


def _load(impl_spec: str):
    spec = third_parties().get(impl_spec)
    return registry.load(spec.target if spec else impl_spec, "expert_parallel")


@dataclass
class ExpertParallelSweep:
    impls: list[str] = field(default_factory=lambda: ["reference"])
    world_sizes: list[int] = field(default_factory=lambda: [2, 4])
    tokens: list[int] = field(default_factory=lambda: [256, 1024])
    skews: list[bool] = field(default_factory=lambda: [False, True])
    hidden: int = 256
    ffn: int = 512
    experts: int = 8
    top_k: int = 2
    iters: int = 5
    warmup: int = 1


def bench_rank(impl_spec: str, cfg: ExpertParallelSweep, tokens: int, skew: bool) -> dict:
    import torch
    import torch.distributed as dist

    from harness.runtime.rank import rank_device

    from .case import Case, _dense

    n, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    case = Case(hidden=cfg.hidden, ffn=cfg.ffn, experts=cfg.experts, top_k=cfg.top_k, tokens=tokens, skew=skew)
    dense = _dense(case, n, device).float()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n * tokens, cfg.hidden, generator=gen).to(device)
    if skew:
        x[:, 0] = 4.0
    if impl_spec == "one-device":
        xd = x.requires_grad_()

        def whole():
            y, aux = dense(xd)
            (y.sum() + aux).backward()
        return {"times": time_iterations(whole, cfg.iters, cfg.warmup, device), "bytes_sent": 0.0}
    impl = _load(impl_spec)
    with getattr(impl, "context", contextlib.nullcontext)():  # megatron-core's: its CPU redirect
        return _bench_sharded(impl, dense, x, cfg, tokens, n, r, device)


def _bench_sharded(impl, dense, x, cfg, tokens: int, n: int, r: int, device) -> dict:
    import torch
    import torch.distributed as dist

    from reference.cost_model import collective_bytes, ep_layer_comm_bytes

    try:
        module = impl.shard(dense, dist.group.WORLD, None)
        x_local = x[r * tokens:(r + 1) * tokens].clone().requires_grad_()
        counter = [0.0]
        with counted_traffic(counter):
            y, aux = module(x_local)
            (y.sum() + aux).backward()
    except (NotImplementedError, ValueError) as exc:
        return {"unsupported": str(exc).splitlines()[0]}

    def step():
        y, aux = module(x_local)
        (y.sum() + aux).backward()
    out = {"times": time_iterations(step, cfg.iters, cfg.warmup, device), "bytes_sent": counter[0]}
    counts = getattr(module, "last_counts", None)
    if counts is not None:  # ours: the exact model of the routing it saw, and the forward without expert work
        # + the load-balancing loss's three all-reduces over the group (E counts, the token total, the loss)
        aux = collective_bytes("all_reduce", n, 4 * cfg.experts) + 2 * collective_bytes("all_reduce", n, 4)
        out["bytes_model"] = ep_layer_comm_bytes(*counts, getattr(module, "ep_rank", r), cfg.hidden, 4)["total"] + aux
        out["received"] = sum(counts[1])
        experts = module.experts  # identity experts: what is left is routing, the all-to-alls and the combine
        module.experts = torch.nn.ModuleList(torch.nn.Identity() for _ in experts)
        with torch.no_grad():
            out["dispatch"] = time_iterations(lambda: module(x_local), cfg.iters, cfg.warmup, device)
        module.experts = experts
    return out


def run_sweep(cfg: ExpertParallelSweep, get_world, run_dir, progress=STDERR) -> int:
    from reference.cost_model import balanced_ep_bytes

    shapes = list(itertools.product(cfg.tokens, cfg.skews))
    cases = [(1, "one-device", t, s) for t, s in shapes]
    cases += [(n, impl, t, s) for n, impl, (t, s) in itertools.product(cfg.world_sizes, cfg.impls, shapes)]
    for done, (n, impl, tokens, skew) in enumerate(cases, 1):
        world = get_world(n)
        per_rank = call_case(world, bench_rank, impl, cfg, tokens, skew)
        row = {"suite": "expert_parallel", "op": f"E{cfg.experts}k{cfg.top_k}/T{tokens}{'-skew' if skew else ''}",
               "impl": impl, "backend": world.backend, "world_size": n, "dtype": "float32", "iters": cfg.iters,
               "warmup": cfg.warmup, "count": tokens}
        said = declined(per_rank)
        if said:
            row.update(said)
        else:
            row.update(status="ok", comm_bytes_measured=max(r["bytes_sent"] for r in per_rank),
                       **summarize([r["times"] for r in per_rank]))
            if impl != "one-device":
                row["comm_bytes_predicted"] = balanced_ep_bytes(tokens, cfg.top_k, cfg.hidden, n, 4)["total"]
            if all("bytes_model" in r for r in per_rank):
                row["comm_bytes_routed"] = max(r["bytes_model"] for r in per_rank)
                row["dispatch_p50_us"] = summarize([r["dispatch"] for r in per_rank])["time_p50_us"]
                row["received_max"] = max(r["received"] for r in per_rank)
        run_dir.append("benchmarks.csv", row)
        if progress:
            extra = f"p50 {row['time_p50_us'] / 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
            print(f"[{done}/{len(cases)}] expert_parallel ep={n} {impl} T {tokens}{' skewed' if skew else ''}: {extra}",
                  file=progress, flush=True)
    return len(cases)


def expert_parallel_section(rows, run_dir, md) -> list[str]:
    """The report section: per ep, each implementation's step and dispatch time and bytes against the tokens
    and the skew."""
    ok, out = opening(rows, "## Expert parallelism: one MoE layer, forward + backward",
                      "An MoE layer (a router, SwiGLU experts, top-k) over an EP group, each rank its own tokens, per "
                      "implementation, tokens per rank and skew (`-skew`: every token routed to EP rank 0's experts); "
                      "`one-device`: the same layer on one rank's share of the tokens. `dispatch ms`: the forward "
                      "with identity experts (routing, the all-to-alls, the combine). Bytes: the busiest rank's, "
                      "counted, against the exact model of the routing it saw (`routed`) and the balanced-routing "
                      "model the planner uses (`predicted`).")
    if not len(ok):
        return out + NO_ROWS
    ok["ms"] = ok["time_p50_us"] / 1e3
    ok["dispatch ms"] = ok.get("dispatch_p50_us", float("nan")) / 1e3
    cols = [c for c in ["world_size", "impl", "op", "ms", "dispatch ms", "received_max", "comm_bytes_measured",
                        "comm_bytes_routed", "comm_bytes_predicted"] if c in ok.columns]
    out += [md(ok.sort_values(["world_size", "impl", "op"])[cols], ".4g", index=False), ""]
    return out + not_provided(rows, md, ["world_size", "impl", "op", "detail"])
