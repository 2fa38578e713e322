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
import re
from dataclasses import asdict, dataclass

from reference.cost_model import (
    activation_memory,
    balanced_ep_bytes,
    bubble_fraction,
    cp_activation_memory,
    cp_layer_comm_bytes,
    dp_step_comm_bytes,
    expert_params,
    tp_layer_comm_bytes,
    training_memory,
)

_COUNT = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_MEMORY = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
           "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
MAX_TP = 8  # tensor parallelism stays inside one node's NVLink domain


class PlanError(ValueError):
    """A bad plan argument; one sentence."""


def parse_count(text: str) -> float:
    """'70B', '7.5e9', '350M', '1T' -> a number of parameters."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]?)\s*", str(text))
    if not m or m.group(2).upper() not in _COUNT or float(m.group(1)) <= 0:
        raise PlanError(f"--params {text!r} is not a parameter count; use e.g. 70B, 7.5e9, 350M or 1T.")
    return float(m.group(1)) * _COUNT[m.group(2).upper()]


def parse_memory(text: str) -> float:
    """'80GB', '1TB', '80GiB', '8e10' -> bytes (GB = 1e9, GiB = 2^30)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = (m.group(2).upper() or "B") if m else ""
    if not m or unit not in _MEMORY or float(m.group(1)) <= 0:
        raise PlanError(f"--device-memory {text!r} is not a memory size; use e.g. 80GB, 1TB or 80GiB.")
    return float(m.group(1)) * _MEMORY[unit]


@dataclass(frozen=True)
class Model:
    params: float
    seq: int
    batch: int
    """Micro-batch size."""
    hidden: int
    heads: int
    layers: int
    microbatches: int = 1
    """Microbatches per step (gradient accumulation / pipeline microbatches)."""
    sequence_parallel: bool = False
    recompute: str = "none"
    vocab: int = 0
    """Vocabulary (LM head and embedding) for the time prediction; 0: none."""
    ffn: int = 0
    """MLP width for the time prediction; 0: 4 hidden."""
    kv_heads: int = 0
    """Grouped-query KV heads (context parallelism's K/V bytes); 0: ``heads``."""
    cp_algorithm: str = "ring"
    """How context parallelism attends: ring (pass-KV) or ulysses (all-to-all over heads)."""
    experts: int = 0
    """Routed experts per layer (a mixture of experts in place of each MLP); 0: a dense model."""
    top_k: int = 2
    """Experts per token."""
    expert_ffn: int = 0
    """Each expert's SwiGLU width; 0: ``ffn`` (or 4 hidden)."""

    @property
    def expert_params(self) -> float:
        """The routed experts' parameters (part of ``params``): layers x E x 3 hidden x expert_ffn."""
        if not self.experts:
            return 0.0
        return expert_params(self.layers, self.experts, self.hidden, self.expert_ffn or self.ffn or 4 * self.hidden)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    zero: int
    cp: int = 1
    """Context-parallel ranks: the sequence split over them; ZeRO shards over dp x cp (torchtitan's rule)."""
    ep: int = 1
    """Expert-parallel ranks (dividing dp x cp): the experts split over them, their state replicated — and
    ZeRO sharded — over the dp x cp / ep ranks holding the same experts."""


def _states(model: Model, layout: Layout):
    """(model-state bytes: the dense part over dp x cp x tp x pp, the experts' over ep x pp with their
    expert-data-parallel group dp x cp / ep; the DP gradient-sync bytes of both)."""
    cp, ep = layout.cp, layout.ep
    experts = model.expert_params
    if experts >= model.params:
        raise ValueError(f"the {model.experts} experts' {experts:.3g} parameters are not fewer than --params "
                         f"({model.params:.3g}): --params counts every parameter, experts included.")
    dense = training_memory(model.params - experts, zero_stage=layout.zero, dp=layout.dp * cp, tp=layout.tp,
                            pp=layout.pp)
    comm = dp_step_comm_bytes((model.params - experts) / (layout.tp * layout.pp), layout.zero, layout.dp * cp)
    if not experts:
        return dense, comm
    edp = layout.dp * cp // ep
    routed = training_memory(experts / ep, zero_stage=layout.zero, dp=edp, pp=layout.pp)
    comm += dp_step_comm_bytes(experts / (ep * layout.pp), layout.zero, edp) if edp > 1 else 0.0
    return type(dense)(**{k: getattr(dense, k) + getattr(routed, k) for k in ("weights", "gradients", "optimizer")}), \
        comm


def estimate(model: Model, layout: Layout) -> dict:
    """Per-device bytes (weights, gradients, optimizer, activations, total) and per-step communication.
    With cp > 1: each rank holds seq / cp tokens' activations (``cp_activation_memory``: the ring keeps no
    s x s scores, Ulysses keeps h / cp heads' whole ones), the model state is sharded over dp x cp, TP and
    PP move seq / cp tokens, and the attention sends ``cp_layer_comm_bytes`` per layer and microbatch."""
    if model.layers % layout.pp:
        raise PlanError(f"--pp ({layout.pp}) must divide --layers ({model.layers}).")
    cp, ep = layout.cp, layout.ep
    try:
        if model.seq % cp:
            raise ValueError(f"--cp ({cp}) must divide --seq ({model.seq}).")
        if ep > 1 and not model.experts:
            raise ValueError(f"--ep ({ep}) splits experts: give --experts.")
        if (layout.dp * cp) % ep:
            raise ValueError(f"--ep ({ep}) must divide dp x cp ({layout.dp * cp}).")
        if model.experts and (model.experts % ep or not 1 <= model.top_k <= model.experts):
            raise ValueError(f"--ep ({ep}) must divide --experts ({model.experts}) and --top-k ({model.top_k}) be "
                             "between 1 and it.")
        states, dp_comm = _states(model, layout)
        stage_layers = model.layers // layout.pp
        # 1F1B's first stage holds min(pp, m) microbatches in flight, each for layers / pp layers.
        in_flight = min(layout.pp, model.microbatches)
        if cp > 1:
            acts = in_flight * cp_activation_memory(model.cp_algorithm, model.seq, model.batch, model.hidden,
                                                    model.heads, stage_layers, cp=cp, tp=layout.tp,
                                                    sequence_parallel=model.sequence_parallel,
                                                    recompute=model.recompute)
        else:
            acts = in_flight * activation_memory(model.seq, model.batch, model.hidden, model.heads, stage_layers,
                                                 tp=layout.tp, sequence_parallel=model.sequence_parallel,
                                                 recompute=model.recompute)
        tokens = model.seq // cp
        ep_comm = balanced_ep_bytes(model.batch * tokens, model.top_k, model.hidden, ep)["total"] * stage_layers \
            * model.microbatches if ep > 1 else 0.0
        tp_comm = tp_layer_comm_bytes(model.batch, tokens, model.hidden, layout.tp) * stage_layers \
            * model.microbatches
        cp_comm = 0.0
        if cp > 1:
            kv = model.kv_heads or model.heads
            cp_comm = cp_layer_comm_bytes(model.cp_algorithm, model.batch, model.seq, model.heads // layout.tp,
                                          max(kv // layout.tp, 1), model.hidden // model.heads, cp)["total"] \
                * stage_layers * model.microbatches
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    # A middle stage sends each microbatch's activations forward and their gradients backward.
    pp_comm = 2 * model.batch * tokens * model.hidden * 2 * model.microbatches if layout.pp > 1 else 0.0
    memory = {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
              "activations": acts}
    memory["total"] = sum(memory.values())
    comm = {"dp": dp_comm, "tp": tp_comm, "pp": pp_comm, **({"cp": cp_comm} if cp > 1 else {}),
            **({"ep": ep_comm} if ep > 1 else {})}
    comm["total"] = sum(comm.values())
    return {"layout": asdict(layout), "memory_bytes": memory, "comm_bytes_per_step": comm,
            "bubble_fraction_1f1b": bubble_fraction("1f1b", layout.pp, model.microbatches)}


def layouts(model: Model, gpus: int, cp: int = 1, ep: int = 1):
    """Every (dp, tp, pp, zero) with dp * tp * pp * cp == gpus, tp <= 8 dividing heads, pp dividing layers,
    ep dividing dp x cp (cp and ep as given)."""
    rest = gpus // cp
    for tp in (t for t in range(1, min(MAX_TP, rest) + 1) if rest % t == 0 and model.heads % t == 0):
        for pp in (p for p in range(1, rest // tp + 1) if (rest // tp) % p == 0 and model.layers % p == 0):
            if (rest // (tp * pp) * cp) % ep:
                continue
            for zero in range(4):
                yield Layout(dp=rest // (tp * pp), tp=tp, pp=pp, zero=zero, cp=cp, ep=ep)


def fitting(model: Model, gpus: int, device_memory: float, cp: int = 1, ep: int = 1) -> list[dict]:
    """Layouts that fit, ranked by 1F1B bubble, then communication per step, then memory."""
    fits = [e for e in (estimate(model, lay) for lay in layouts(model, gpus, cp, ep))
            if e["memory_bytes"]["total"] <= device_memory]
    return sorted(fits, key=lambda e: (round(e["bubble_fraction_1f1b"], 12), e["comm_bytes_per_step"]["total"],
                                       e["memory_bytes"]["total"]))


def predicted(model: Model, layout: Layout, profile, schedule: str, dtype: str) -> dict:
    """Predicted step time and its parts (seconds) of ``layout`` on the profile's machine."""
    from dataclasses import replace

    from harness.cost_model.predict import PARTS, gpt_workload, moe_workload, predict_step
    from harness.cost_model.profile import ProfileError

    work = gpt_workload(model.vocab, model.hidden, model.heads, model.ffn or 4 * model.hidden, model.layers,
                        model.seq, model.batch, dtype)
    if model.kv_heads:  # grouped-query K/V: what the cp exchange moves
        work = replace(work, attention=replace(work.attention, kv_heads=model.kv_heads))
    if model.experts:
        ffn = model.ffn or 4 * model.hidden
        work = moe_workload(work, model.hidden, ffn, model.experts, model.top_k, model.expert_ffn or ffn)
    try:
        pred = predict_step(profile, work, layout.dp, layout.pp, layout.tp, layout.zero, schedule,
                            model.microbatches, recompute=model.recompute != "none", cp=layout.cp,
                            cp_algorithm=model.cp_algorithm, ep=layout.ep)
    except (ProfileError, ValueError) as exc:
        raise PlanError(str(exc)) from None
    return {k: pred[k] for k in (*PARTS, "step_s", "bubble_fraction")}


def ranked_by_time(model: Model, gpus: int, profile, schedule: str, dtype: str,
                   device_memory: float | None, cp: int = 1, ep: int = 1) -> list[dict]:
    """Every layout of ``gpus`` (at ``cp`` and ``ep``) with its prediction, fastest first (then least memory)."""
    out = []
    for lay in layouts(model, gpus, cp, ep):
        if schedule == "interleaved" and (lay.pp == 1 or model.microbatches % lay.pp or 2 * lay.pp > model.layers):
            continue
        e = estimate(model, lay)
        e["predicted_s"] = predicted(model, lay, profile, schedule, dtype)
        e["fits"] = None if device_memory is None else e["memory_bytes"]["total"] <= device_memory
        out.append(e)
    return sorted(out, key=lambda e: (e["predicted_s"]["step_s"], e["memory_bytes"]["total"]))


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
             f"ZeRO-{lay['zero']}: per device")
    for heading, (label, unit), values in (
            (title, ("memory", "GB (1e9 bytes)"), plan["memory_bytes"]),
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
                  experts=args.experts or 0, top_k=args.top_k, expert_ffn=args.expert_ffn or 0)
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
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--device-memory", default=None, help="e.g. 80GB: also list the layouts that fit")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="a machine profile (paritybench calibrate): rank every layout by predicted step time")
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="the backend the plan is for (checked against the profile's)")
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved", "zb-h1"])
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
