"""Predicted step time of a layout from a machine profile, with its parts.

    step = makespan of the pipeline schedule simulated with this layout's costs
           + data-parallel gradient sync (by ZeRO stage) + the step's loss all-reduces

Per stage s and microbatch (``reference.pipeline.simulate`` with per-(stage, kind) costs):
    F_s = FLOPs_s / (tp rate) + TP all-reduces of the activations (2 per layer; vocabulary-parallel
          embedding 1, LM head's cross-entropy 3 small ones)
    B_s = 2 FLOPs_s / (tp rate) + TP all-reduces (2 per layer, 1 for the head), + F_s's compute again
          with recomputation; zb-h1 splits it into I and W, half each
    SEND = what posting one activation message occupies the sender for (profile ``send``), and each
          cross-rank dependency waits the rest of its ``one_way`` time; sender and receiver each also pay
          what a message costs ranks that compute (profile ``loaded``: gloo's threads on a full CPU).
rate is the profile's matmul FLOP/s with all of the world's ranks busy; every time α–β from the profile
at this world size. The parts reported are the busiest rank's: compute, TP communication, PP sends and
its idle time (the bubble) add up to the makespan; plus dp and sync: ``step_s`` equals their sum.

Context parallelism (``cp`` > 1): each rank computes seq / cp tokens (every FLOP term, the activation
messages and the cross-entropy's rows divide by cp — the zigzag layout balances causal attention), the
gradients sync over dp x cp, the loss all-reduces over cp too, and each layer's attention pays its cp
exchange (``cp_attention_time``), forward and backward (and forward again with recomputation), in ``cp_s``.

Expert parallelism (a workload with ``experts``, ``ep`` > 1): each layer's dispatch and combine all-to-alls
(``ep_exchange_time``), forward and backward, in ``ep_s``; the experts' gradients sync over their expert-
data-parallel group (dp x cp / ep ranks), the rest over dp x cp.
"""

from __future__ import annotations

from harness.cost_model.profile import Profile
from harness.cost_model.workload import (  # noqa: F401 - the workloads, read through here too
    BYTES,
    Attention,
    Experts,
    Workload,
    gpt_workload,
    llama_workload,
    mlp_workload,
    moe_workload,
)

PARTS = ("compute_s", "tp_s", "cp_s", "ep_s", "pp_s", "bubble_s", "dp_s", "sync_s")


def ep_exchange_time(profile: Profile, work: Workload, ep: int, elem: int, world: int) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's expert-parallel exchange on one microbatch: the dispatch
    and the combine all-to-all of tokens x top_k rows of the activation width (``reference.cost_model.
    balanced_ep_bytes``: balanced routing) each way, each priced as the profile's all-gather of the same
    bytes (both move (ep - 1) / ep of them in ep - 1 steps; the counts' and ids' few bytes left out)."""
    if ep == 1:
        return 0.0, 0.0
    if work.moe is None:
        raise ValueError("this workload has no experts: expert parallelism does not apply to it.")
    rows_bytes = work.activation_bytes * work.moe.top_k
    one = profile.collective_time("all_gather", ep, rows_bytes, world)
    return 2 * one, 2 * one


def cp_attention_time(profile: Profile, algorithm: str, att: Attention, cp: int, tp: int, elem: int,
                      world: int) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's context-parallel exchange on one microbatch, the bytes of
    ``reference.cost_model.cp_layer_comm_bytes`` (this TP rank's heads):
    - ring: each of its cp - 1 forward and 2 cp - 1 backward K/V (dK/dV) blocks one point-to-point message
      (``one_way``: the reference waits for each block before it attends with it);
    - ulysses: four all-to-alls each way (q, k, v, the output), each priced as the profile's ring all-gather
      of the same bytes: both move (cp - 1) / cp of them in cp - 1 steps."""
    if cp == 1:
        return 0.0, 0.0
    heads, kv = att.heads // tp, max(att.kv_heads // tp, 1)
    local = att.rows * (att.seq // cp) * att.head_dim * elem
    if algorithm == "ring":
        block = profile.message_time("one_way", 2 * kv * local, world)
        return (cp - 1) * block, (2 * cp - 1) * block
    if algorithm == "ulysses":
        sizes = (heads, max(kv, cp), max(kv, cp), heads)
        each = sum(profile.collective_time("all_gather", cp, n * local, world) for n in sizes)
        return each, each
    raise ValueError(f"cp_algorithm must be ring or ulysses; got {algorithm!r}.")


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per stage, split as the reference 3D stack splits them (``reference.stack.compose.stage_bounds``)."""
    from reference.stack.compose import stage_bounds

    bounds = stage_bounds(layers, stages)
    return [bounds[s + 1] - bounds[s] for s in range(stages)]


def predict_step(profile: Profile, work: Workload, dp: int, pp: int, tp: int, zero: int, schedule: str,
                 microbatches: int, recompute: bool = False, cp: int = 1, cp_algorithm: str = "ring",
                 ep: int = 1) -> dict:
    """Predicted seconds per step and its parts (``PARTS``), the simulated bubble fraction and timeline."""
    from reference.pipeline import INTERLEAVED, V_SHAPED, add_send_recv, generate, simulate

    world = dp * pp * tp * cp
    work = work.over_cp(cp)
    v = 2 if (schedule in INTERLEAVED and pp > 1) or schedule in V_SHAPED else 1  # V: two half stages per rank
    num_stages = pp * v
    rate = profile.flops_per_s(work.dtype, world)
    overhead = (profile.layer_overhead(work.layer_kind, work.dtype, world) if work.layer_kind else None) or 0.0
    elem = BYTES.get(work.dtype, 4)

    def ar(size: float) -> float:
        return profile.collective_time("all_reduce", tp, size, world)

    layers = stage_layers(work.layers, num_stages)
    cp_f, cp_b = cp_attention_time(profile, cp_algorithm, work.attention, cp, tp, elem, world) if cp > 1 \
        else (0.0, 0.0)
    if (dp * cp) % ep:
        raise ValueError(f"ep ({ep}) must divide dp x cp ({dp * cp}).")
    ep_f, ep_b = ep_exchange_time(profile, work, ep, elem, world)
    costs, split = {}, {}
    for s, n in enumerate(layers):
        first, last = s == 0, s == num_stages - 1
        fwd = n * work.layer_flops + (work.head_flops if last else 0.0)
        bwd = 2 * fwd - (work.layer_flops if first and not work.first_layer_input_grad else 0.0)
        tp_f = n * work.tp_allreduces_per_layer * ar(work.activation_bytes)
        tp_b = n * work.tp_allreduces_per_layer * ar(work.activation_bytes)
        if work.vocab_parallel and tp > 1:
            tp_f += (ar(work.activation_bytes) if first else 0.0) + (3 * ar(work.tokens * elem) if last else 0.0)
            tp_b += ar(work.activation_bytes) if last else 0.0
        whole = n * work.moe.layer_flops * (1 - 1 / tp) if work.moe is not None else 0.0  # what tp does not split
        comp_f = (fwd / tp + whole) / rate + n * overhead / 3
        comp_b = (bwd / tp + 2 * whole) / rate + 2 * n * overhead / 3 + (comp_f if recompute else 0.0)
        cp_fs, cp_bs = n * cp_f, n * cp_b + (n * cp_f if recompute else 0.0)
        ep_fs, ep_bs = n * ep_f, n * ep_b + (n * ep_f if recompute else 0.0)
        costs[(s, "F")] = comp_f + tp_f + cp_fs + ep_fs
        costs[(s, "B")] = comp_b + tp_b + (tp_f if recompute else 0.0) + cp_bs + ep_bs
        costs[(s, "I")] = costs[(s, "W")] = costs[(s, "B")] / 2
        split[s] = {"F": (comp_f, tp_f, cp_fs, ep_fs),
                    "B": (comp_b, tp_b + (tp_f if recompute else 0.0), cp_bs, ep_bs)}
    if pp > 1:
        send = profile.message_time("send", work.activation_bytes, world)
        one_way = profile.message_time("one_way", work.activation_bytes, world)
        loaded = profile.message_time("loaded", work.activation_bytes, world, missing=0.0)
        costs.update(SEND_F=send + loaded, SEND_B=send + loaded, RECV_F=loaded, RECV_B=loaded,
                     comm=max(0.0, one_way - send))
    timeline = simulate(add_send_recv(generate(schedule, pp, microbatches, v)), costs)
    parts = _rank_parts(timeline, split)
    parts["bubble_s"] = max(0.0, timeline.makespan - sum(parts[k] for k in ("compute_s", "tp_s", "cp_s", "ep_s",
                                                                           "pp_s")))
    parts["dp_s"] = _dp_time(profile, work, layers, v, (dp, tp, cp, ep), zero, microbatches, world)
    parts["sync_s"] = sum(profile.collective_time("all_reduce", g, 8, world) for g in (pp, tp, dp, cp))
    busy = sum(e - s for row in timeline.events for a, s, e in row if a.kind in "FBIW")
    return {**parts, "step_s": sum(parts[k] for k in PARTS), "makespan_s": timeline.makespan,
            # an overlapped pair's two shares sum to its cost only to a rounding: never below 0
            "bubble_fraction": max(0.0, 1 - busy / (pp * timeline.makespan)) if timeline.makespan > 0 else 0.0,
            "timeline": timeline}


def _dp_time(profile: Profile, work: Workload, layers: list[int], v: int, sizes: tuple, zero: int,
             microbatches: int, world: int) -> float:
    """The busiest stage's gradient sync. The embedding is on the first stage, the head on the last (both on one
    stage when there is one); parameters are replicated over cp: gradients sync (and ZeRO shards) over dp x cp;
    the experts over their expert-data-parallel group (dp x cp / ep), this rank's E / ep of them per layer."""
    dp, tp, cp, ep = sizes
    elem, num_stages = BYTES.get(work.dtype, 4), len(layers)
    stage_params = max((n * work.layer_params + work.end_params / 2 * ((s == 0) + (s == num_stages - 1))) / tp
                       for s, n in enumerate(layers)) * v
    tensors = work.tensors_per_layer * max(layers) * v
    time = dp_sync_time(profile, zero, dp * cp, stage_params * elem, tensors, microbatches, world)
    if work.moe is not None:
        experts = max(layers) * v * work.moe.layer_params / ep
        time += dp_sync_time(profile, zero, dp * cp // ep, experts * elem, 3 * work.moe.experts // ep
                             * max(layers) * v, microbatches, world)
    return time


def _rank_parts(timeline, split) -> dict:
    """compute, tp, cp, ep and pp (send) seconds of the rank with the most busy time."""
    best = None
    for row in timeline.events:
        got = dict.fromkeys(("compute_s", "tp_s", "cp_s", "ep_s", "pp_s"), 0.0)
        for a, start, end in row:
            if a.kind in ("F", "B", "I", "W"):
                half = 0.5 if a.kind in ("I", "W") else 1.0
                for key, x in zip(("compute_s", "tp_s", "cp_s", "ep_s"),
                                  split[a.stage]["B" if a.kind in ("I", "W") else a.kind], strict=True):
                    got[key] += x * half
            else:
                got["pp_s"] += end - start
        if best is None or sum(got.values()) > sum(best.values()):
            best = got
    return best


def dp_sync_time(profile: Profile, zero: int, dp: int, grad_bytes: float, tensors: int, microbatches: int,
                 world: int) -> float:
    """ZeRO 0: an all-reduce per parameter tensor; 1, 2: reduce-scatter of the flat gradients + all-gather of
    the parameters; 3: also an all-gather of the parameters per microbatch, forward and backward."""
    if dp == 1:
        return 0.0
    if zero == 0:
        latency = profile.collective_time("all_reduce", dp, 0.0, world)
        return profile.collective_time("all_reduce", dp, grad_bytes, world) + (tensors - 1) * latency
    both = profile.collective_time("reduce_scatter", dp, grad_bytes, world) + \
        profile.collective_time("all_gather", dp, grad_bytes, world)
    return both + (2 * microbatches * profile.collective_time("all_gather", dp, grad_bytes, world) if zero == 3
                   else 0.0)


def planned_columns(prediction: dict) -> dict:
    """A prediction as benchmark-row columns."""
    out = {"time_planned_us": prediction["step_s"] * 1e6, "bubble_planned": prediction["bubble_fraction"]}
    out.update({f"plan_{k[:-2]}_us": prediction[k] * 1e6 for k in PARTS})
    return out


def load_profile(path):
    """The profile a sweep predicts with, or None (no prediction) when the sweep was given none."""
    return Profile.load(path) if path else None
