"""``paritybench plan``: per-device memory and per-step communication of a layout, from the cost model.

    paritybench plan --params 70B --zero 1 --dp 64 --tp 8 --pp 4 --seq 4096 --batch 1 --hidden 8192 \
        --heads 64 --layers 80 [--device-memory 80GB] [--json]

Answers "does it fit, and how must I split it": with --device-memory it also lists every layout of the
same GPU count (tp within one 8-GPU node, pp dividing the layers, ZeRO 0-3) that fits, ranked by
1F1B bubble fraction, then communication per step, then memory.

With --profile PROFILE.json (``paritybench calibrate``) every layout of the GPU count gets a predicted step
time on the machine the profile was measured on (``harness.cost_model.predict``: compute, TP / PP / DP
communication, the schedule's bubble simulated with those costs), and the table ranks them by it, with the
parts, memory, and whether each fits.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from harness.cost_model.plan import (
    Layout,
    Model,
    PlanError,
    estimate,
    fitting,
    layouts,
    parse_count,
    parse_memory,
    predicted,
    ranked_by_time,
)
from reference.cost_model import OFFLOADS
from reference.pipeline import GENERATORS


def render_time_ranking(ranked: list[dict], profile, schedule: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(130, Console().width))
    host = profile.host
    console.print(f"[bold]layouts ranked by predicted step time ({schedule}) on {host.get('device')} / "
                  f"{host.get('cpu')} ({profile.backend}, profile {profile.source})[/bold]")
    table = Table()
    extra = [k for k in ("cp", "ep") if any(e["layout"].get(k, 1) > 1 for e in ranked)]
    parts = ("step_s", "compute_s", "tp_s", *(f"{k}_s" for k in extra), "pp_s", "bubble_s", "dp_s", "sync_s")
    for col in ("rank", "dp", "tp", "pp", "ZeRO", "step ms", "compute", "tp comm", *(f"{k} comm" for k in extra),
                "pp comm", "bubble", "dp comm", "sync", "memory GB", "fits"):
        table.add_column(col, justify="right")
    for i, e in enumerate(ranked[:20], 1):
        lo, p = e["layout"], e["predicted_s"]
        table.add_row(str(i), str(lo["dp"]), str(lo["tp"]), str(lo["pp"]), str(lo["zero"]),
                      *(f"{p[k] * 1e3:,.1f}" for k in parts),
                      _gb(e["memory_bytes"]["total"]), {None: "-", True: "yes", False: "no"}[e["fits"]])
    console.print(table)


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def render(model: Model, plan: dict, device_memory: float | None, ranked: list[dict] | None,
           list_fitting: bool = True) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    lay = plan["layout"]
    cp = f" cp={lay['cp']} ({model.cp_algorithm})" if lay.get("cp", 1) > 1 else ""
    ep = f" ep={lay['ep']}" if lay.get("ep", 1) > 1 else ""
    moe = f" ({model.expert_params / 1e9:.3g}B in {model.experts} experts per layer, top-{model.top_k})" \
        if model.experts else ""
    title = (f"{model.params / 1e9:g}B parameters{moe}, dp={lay['dp']} tp={lay['tp']} pp={lay['pp']}{cp}{ep} "
             f"ZeRO-{lay['zero']}{', float8 weights' if model.fp8_weights else ''}: per device")
    host = [(f"host memory ({model.offload} offloaded), per rank", ("memory", "GB (1e9 bytes)"), plan["host_bytes"])] \
        if "host_bytes" in plan else []
    for heading, (label, unit), values in (
            (title, ("memory", "GB (1e9 bytes)"), plan["memory_bytes"]), *host,
            ("communication per step, bytes each device sends", ("paradigm", "GB"), plan["comm_bytes_per_step"])):
        console.print(f"[bold]{heading}[/bold]")
        table = Table()
        table.add_column(label)
        table.add_column(unit, justify="right")
        for key, value in values.items():
            table.add_row(key, _gb(value))
        console.print(table)
    if device_memory is not None:
        total = plan["memory_bytes"]["total"]
        verdict = "fits" if total <= device_memory else "does NOT fit"
        console.print(f"This layout needs {_gb(total)} GB per device: it {verdict} in {_gb(device_memory)} GB.")
        if not list_fitting:  # --profile ranks every layout by time instead, with a fits column
            return
        gpus = lay['dp'] * lay['tp'] * lay['pp'] * lay.get('cp', 1)
        at_cp = "".join(f" at {k} = {lay[k]}" for k in ("cp", "ep") if lay.get(k, 1) > 1)
        console.print(f"[bold]layouts of {gpus} GPUs{at_cp} that fit: least bubble, then least communication[/bold]")
        table = Table()
        for col in ("rank", "dp", "tp", "pp", "ZeRO", "memory GB", "comm GB/step", "1F1B bubble"):
            table.add_column(col, justify="right")
        for i, e in enumerate((ranked or [])[:15], 1):
            lo = e["layout"]
            table.add_row(str(i), str(lo["dp"]), str(lo["tp"]), str(lo["pp"]), str(lo["zero"]),
                          _gb(e["memory_bytes"]["total"]), _gb(e["comm_bytes_per_step"]["total"]),
                          f"{e['bubble_fraction_1f1b']:.3f}")
        console.print(table if ranked else "No layout of this GPU count fits.")


def load_profile(args, gpus: int):
    """The --profile, checked against the plan's backend and GPU count; None without --profile."""
    if not args.profile:
        return None
    from harness.cost_model.profile import Profile, ProfileError

    try:
        profile = Profile.load(args.profile)
        profile.check(args.backend, gpus)
    except ProfileError as exc:
        raise PlanError(str(exc)) from None
    return profile


def run(args) -> int:
    model = Model(params=parse_count(args.params), seq=args.seq, batch=args.batch, hidden=args.hidden,
                  heads=args.heads, layers=args.layers, microbatches=args.microbatches,
                  sequence_parallel=args.sequence_parallel, recompute=args.recompute, vocab=args.vocab or 0,
                  ffn=args.ffn or 0, kv_heads=args.kv_heads or 0, cp_algorithm=args.cp_algorithm,
                  experts=args.experts or 0, top_k=args.top_k, expert_ffn=args.expert_ffn or 0,
                  fp8_weights=args.fp8_weights, offload=args.offload)
    layout = Layout(dp=args.dp, tp=args.tp, pp=args.pp, zero=args.zero, cp=args.cp, ep=args.ep)
    gpus = args.dp * args.tp * args.pp * args.cp
    plan = estimate(model, layout)
    device_memory = parse_memory(args.device_memory) if args.device_memory else None
    profile = load_profile(args, gpus)
    dtype = args.dtype or (profile.compute[0]["dtype"] if profile else "float32")
    by_time = ranked_by_time(model, gpus, profile, args.schedule, dtype, device_memory, args.cp, args.ep) \
        if profile else None
    ranked = fitting(model, gpus, device_memory, args.cp, args.ep) if device_memory and not profile else None
    if profile:
        plan["predicted_s"] = predicted(model, layout, profile, args.schedule, dtype)
    if args.json:
        out = {"model": asdict(model), **plan}
        if device_memory is not None:
            out.update(device_memory_bytes=device_memory, fits=plan["memory_bytes"]["total"] <= device_memory)
            if ranked is not None:
                out["fitting_layouts"] = ranked
        if by_time is not None:
            out.update(profile=args.profile, schedule=args.schedule, dtype=dtype, layouts_by_predicted_time=by_time)
        print(json.dumps(out, indent=2))
    else:
        render(model, plan, device_memory, ranked, list_fitting=profile is None)
        if by_time is not None:
            render_time_ranking(by_time, profile, args.schedule)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="per-device memory and communication of a parallel layout")
    p.add_argument("--params", required=True, help="parameter count: 70B, 7.5e9, 350M")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    for name in ("dp", "tp", "pp", "cp", "ep"):
        p.add_argument(f"--{name}", type=_positive_int, default=1)
    p.add_argument("--experts", type=_positive_int, default=None,
                   help="routed experts per layer (a mixture of experts; --params counts them)")
    p.add_argument("--top-k", type=_positive_int, default=2, help="experts per token (with --experts)")
    p.add_argument("--expert-ffn", type=_positive_int, default=None, help="each expert's width (default --ffn)")
    p.add_argument("--cp-algorithm", default="ring", choices=["ring", "ulysses"],
                   help="context parallelism's attention: ring (pass-KV) or ulysses (all-to-all over heads)")
    p.add_argument("--kv-heads", type=_positive_int, default=None, help="grouped-query KV heads (default: --heads)")
    for name, default in (("seq", 2048), ("batch", 1), ("hidden", None), ("heads", None), ("layers", None)):
        p.add_argument(f"--{name}", type=_positive_int, default=default, required=default is None)
    p.add_argument("--microbatches", type=_positive_int, default=1, help="microbatches per step")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--fp8-weights", action="store_true",
                   help="weights held and all-gathered in float8 (Megatron's --fp8-param-gather, torchao's FSDP2 "
                        "float8 all-gather): 1 byte per parameter, in memory and in ZeRO's parameter gathers")
    p.add_argument("--offload", default="none", choices=list(OFFLOADS),
                   help="model state kept in host memory: optimizer (its state and the reduced gradients' shard: "
                        "ZeRO-Offload, --zero 1-3), parameters (the weight shard too: --zero 3, FSDP2's "
                        "CPUOffloadPolicy); the memory shown is the device's, the host's apart")
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--device-memory", default=None, help="e.g. 80GB: also list the layouts that fit")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="a machine profile (paritybench calibrate): rank every layout by predicted step time")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="the backend the plan is for (checked against the profile's)")
    p.add_argument("--schedule", default="1f1b", choices=list(GENERATORS))
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="compute dtype of the prediction (default: the profile's)")
    p.add_argument("--vocab", type=_positive_int, default=None, help="vocabulary size (LM head) for the prediction")
    p.add_argument("--ffn", type=_positive_int, default=None, help="MLP width for the prediction (default 4 hidden)")


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


__all__ = ["Layout", "Model", "PlanError", "estimate", "fitting", "layouts", "parse_count", "parse_memory",
           "run"]
