"""The planner (``paritybench plan``, ``harness.cli.plan``): per-device memory and per-step communication of a
layout from the cost model, every layout of a GPU count that fits, and each one's predicted step time on a
measured machine (``harness.cost_model.predict``)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from reference.cost_model import (
    OFFLOAD_MIN_STAGE,
    activation_memory,
    balanced_ep_bytes,
    bubble_fraction,
    cp_activation_memory,
    cp_layer_comm_bytes,
    dp_step_comm_bytes,
    expert_params,
    offloaded_memory,
    tp_layer_comm_bytes,
)
from reference.pipeline import INTERLEAVED, V_SHAPED

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
    fp8_weights: bool = False
    """The weights held and gathered in float8 (Megatron's ``--fp8-param-gather`` with TransformerEngine's float8
    weights, torchao's FSDP2 float8 all-gather): 1 byte per parameter instead of 2, in memory and in ZeRO's
    parameter all-gathers; gradients (2 bytes) and the fp32 master and Adam state (12) unchanged. Their scales (one
    float32 per tensor or row) are left out."""
    offload: str = "none"
    """Model state kept in host memory (``reference.cost_model.offloaded_memory``): none; optimizer (the optimizer
    state and the reduced gradients' shard: ZeRO-Offload, ZeRO 1-3); parameters (the weight shard too: ZeRO 3,
    FSDP2's CPUOffloadPolicy). The plan's memory is the device's; the host's is ``host_bytes``."""

    @property
    def weight_bytes(self) -> int:
        return 1 if self.fp8_weights else 2

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
    """(model-state bytes on the device and on the host: the dense part over dp x cp x tp x pp, the experts' over
    ep x pp with their expert-data-parallel group dp x cp / ep; the DP gradient-sync bytes of both)."""
    cp, ep = layout.cp, layout.ep
    experts = model.expert_params
    if experts >= model.params:
        raise ValueError(f"the {model.experts} experts' {experts:.3g} parameters are not fewer than --params "
                         f"({model.params:.3g}): --params counts every parameter, experts included.")
    w = model.weight_bytes
    device, host = offloaded_memory(model.params - experts, zero_stage=layout.zero, dp=layout.dp * cp, tp=layout.tp,
                                    pp=layout.pp, weight_bytes=w, offload=model.offload)
    comm = dp_step_comm_bytes((model.params - experts) / (layout.tp * layout.pp), layout.zero, layout.dp * cp,
                              weight_bytes=w)
    if not experts:
        return device, host, comm
    edp = layout.dp * cp // ep
    routed = offloaded_memory(experts / ep, zero_stage=layout.zero, dp=edp, pp=layout.pp, weight_bytes=w,
                              offload=model.offload)
    comm += dp_step_comm_bytes(experts / (ep * layout.pp), layout.zero, edp, weight_bytes=w) if edp > 1 else 0.0
    device, host = (type(a)(**{k: getattr(a, k) + getattr(b, k) for k in ("weights", "gradients", "optimizer")})
                    for a, b in zip((device, host), routed, strict=True))
    return device, host, comm


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
        states, host, dp_comm = _states(model, layout)
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
    out = {"layout": asdict(layout), "memory_bytes": memory, "comm_bytes_per_step": comm,
           "bubble_fraction_1f1b": bubble_fraction("1f1b", layout.pp, model.microbatches)}
    if model.offload != "none":
        out["host_bytes"] = {"weights": host.weights, "gradients": host.gradients, "optimizer": host.optimizer,
                             "total": host.total}
    return out


def layouts(model: Model, gpus: int, cp: int = 1, ep: int = 1):
    """Every (dp, tp, pp, zero) with dp * tp * pp * cp == gpus, tp <= 8 dividing heads, pp dividing layers,
    ep dividing dp x cp (cp and ep as given), zero a stage the model's offload runs at."""
    rest = gpus // cp
    for tp in (t for t in range(1, min(MAX_TP, rest) + 1) if rest % t == 0 and model.heads % t == 0):
        for pp in (p for p in range(1, rest // tp + 1) if (rest // tp) % p == 0 and model.layers % p == 0):
            if (rest // (tp * pp) * cp) % ep:
                continue
            for zero in range(OFFLOAD_MIN_STAGE[model.offload], 4):
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
        chunked = schedule in INTERLEAVED + V_SHAPED  # two stages per rank at least
        if chunked and (2 * lay.pp > model.layers or (schedule in INTERLEAVED and lay.pp == 1)):
            continue
        e = estimate(model, lay)
        try:
            e["predicted_s"] = predicted(model, lay, profile, schedule, dtype)
        except ValueError:  # the schedule's own rule at this pp (interleaved's whole rounds of microbatches)
            continue
        e["fits"] = None if device_memory is None else e["memory_bytes"]["total"] <= device_memory
        out.append(e)
    return sorted(out, key=lambda e: (e["predicted_s"]["step_s"], e["memory_bytes"]["total"]))
