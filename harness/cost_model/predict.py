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

from dataclasses import dataclass, replace

from harness.cost_model.profile import Profile

PARTS = ("compute_s", "tp_s", "cp_s", "ep_s", "pp_s", "bubble_s", "dp_s", "sync_s")
BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Attention:
    """One microbatch's attention, before any split: what context parallelism exchanges."""

    rows: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Experts:
    """A layer's mixture of experts: what expert parallelism splits and exchanges."""

    experts: int
    top_k: int
    layer_params: float
    """One layer's routed experts' parameters (all E of them)."""
    layer_flops: float = 0.0
    """One layer's router and expert forward FLOPs on a microbatch: every TP rank computes them whole (the
    experts are replicated over TP, split over EP only)."""


@dataclass(frozen=True)
class Workload:
    """What one microbatch costs, before tensor parallelism."""

    layers: int
    layer_flops: float
    """Forward FLOPs of one layer on one microbatch."""
    layer_params: float
    activation_bytes: float
    """One microbatch's activations between layers (rows x hidden x dtype bytes)."""
    tokens: int
    """Rows (tokens) per microbatch: the size of the cross-entropy's per-token all-reduces."""
    head_flops: float = 0.0
    """Forward FLOPs of the LM head (last stage)."""
    end_params: float = 0.0
    """Embedding + head parameters, split between the first and the last stage."""
    tp_allreduces_per_layer: int = 2
    vocab_parallel: bool = True
    """Embedding and head vocabulary-parallel (their all-reduces) when tp > 1."""
    first_layer_input_grad: bool = True
    """False where the first stage's input needs no gradient (its first layer's input-grad GEMM skipped)."""
    tensors_per_layer: int = 1
    """Parameter tensors per layer: ZeRO 0 all-reduces each on its own."""
    dtype: str = "float32"
    layer_kind: str = ""
    """The profile's timed layer of this shape (``gpt_block``, ``mlp_layer``): its per-layer overhead beyond
    the GEMMs is added (forward a third, backward two thirds). Empty or not in the profile: GEMMs only."""
    attention: Attention | None = None
    """The layers' attention (None: a workload without one, which context parallelism cannot split)."""
    moe: Experts | None = None
    """The layers' mixture of experts (None: dense; ``layer_params`` then excludes the experts)."""

    def over_cp(self, cp: int) -> Workload:
        """What one of ``cp`` context-parallel ranks computes and moves: seq / cp of every token's share."""
        if cp == 1:
            return self
        if self.attention is None:
            raise ValueError("this workload has no attention: context parallelism does not apply to it.")
        if self.attention.seq % cp:
            raise ValueError(f"cp ({cp}) must divide the sequence ({self.attention.seq} tokens).")
        moe = replace(self.moe, layer_flops=self.moe.layer_flops / cp) if self.moe is not None else None
        return replace(self, layer_flops=self.layer_flops / cp, head_flops=self.head_flops / cp,
                       activation_bytes=self.activation_bytes / cp, tokens=self.tokens // cp, moe=moe)


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
    from reference.pipeline import add_send_recv, generate, simulate

    world = dp * pp * tp * cp
    work = work.over_cp(cp)
    v = 2 if schedule == "interleaved" and pp > 1 else 1
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
    # the embedding on the first stage, the head on the last (both on one stage when there is one)
    stage_params = max((n * work.layer_params + work.end_params / 2 * ((s == 0) + (s == num_stages - 1))) / tp
                       for s, n in enumerate(layers)) * v
    tensors = work.tensors_per_layer * max(layers) * v
    # parameters are replicated over cp: gradients sync (and ZeRO shards) over dp x cp; the experts over their
    # expert-data-parallel group (dp x cp / ep), this rank's E / ep of them per layer
    parts["dp_s"] = dp_sync_time(profile, zero, dp * cp, stage_params * elem, tensors, microbatches, world)
    if work.moe is not None:
        experts = max(layers) * v * work.moe.layer_params / ep
        parts["dp_s"] += dp_sync_time(profile, zero, dp * cp // ep, experts * elem, 3 * work.moe.experts // ep
                                      * max(layers) * v, microbatches, world)
    parts["sync_s"] = sum(profile.collective_time("all_reduce", g, 8, world) for g in (pp, tp, dp, cp))
    busy = sum(e - s for row in timeline.events for a, s, e in row if a.kind in "FBIW")
    return {**parts, "step_s": sum(parts[k] for k in PARTS), "makespan_s": timeline.makespan,
            "bubble_fraction": 1 - busy / (pp * timeline.makespan) if timeline.makespan > 0 else 0.0,
            "timeline": timeline}


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


def gpt_workload(vocab: int, hidden: int, heads: int, ffn: int, layers: int, seq: int, rows: int,
                 dtype: str = "float32") -> Workload:
    """The reference GPT (``reference.models.GPT``): per layer q/k/v/o and the two MLP Linears (with
    biases), attention scores and values 4 rows seq^2 hidden FLOPs; head V x h; untied embedding."""
    tokens = rows * seq
    layer_params = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ffn + ffn + hidden + 4 * hidden  # + 2 LayerNorms
    layer_flops = 2 * tokens * (4 * hidden * hidden + 2 * hidden * ffn) + 4 * rows * seq * seq * hidden
    return Workload(layers=layers, layer_flops=layer_flops, layer_params=layer_params,
                    activation_bytes=tokens * hidden * BYTES.get(dtype, 4), tokens=tokens,
                    head_flops=2 * tokens * hidden * vocab, end_params=2 * vocab * hidden,
                    tensors_per_layer=16, dtype=dtype, layer_kind="gpt_block",
                    attention=Attention(rows, seq, heads, heads, hidden // heads))


def llama_workload(vocab: int, hidden: int, heads: int, kv_heads: int, ffn: int, layers: int, seq: int, rows: int,
                   dtype: str = "float32") -> Workload:
    """The reference Llama (``reference.models.Llama``): per layer q and o (h x h), k and v (h x kv d each),
    the SwiGLU's gate, up and down (h x ffn each), no biases, two RMSNorms; attention scores and values
    4 rows seq^2 hidden FLOPs; head V x h; untied embedding. Its per-layer overhead is the profile's GPT
    block's (``gpt_block``: the one layer the calibration times) — RMSNorm, rotary and the SwiGLU product
    stand in for LayerNorm, GELU and the biases."""
    tokens, kv = rows * seq, hidden // heads * kv_heads
    matrices = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn
    return Workload(layers=layers, layer_flops=2 * tokens * matrices + 4 * rows * seq * seq * hidden,
                    layer_params=matrices + 2 * hidden, activation_bytes=tokens * hidden * BYTES.get(dtype, 4),
                    tokens=tokens, head_flops=2 * tokens * hidden * vocab, end_params=2 * vocab * hidden,
                    tensors_per_layer=9, dtype=dtype, layer_kind="gpt_block",
                    attention=Attention(rows, seq, heads, kv_heads, hidden // heads))


def moe_workload(work: Workload, hidden: int, ffn: int, experts: int, top_k: int, expert_ffn: int) -> Workload:
    """``work`` (a ``gpt_workload``) with each layer's MLP (2 hidden x ffn, its biases) replaced by a router
    (hidden x E) and E SwiGLU experts of ``expert_ffn``, of which each token runs ``top_k``."""
    tokens = work.tokens
    mlp_flops, expert_params = 4 * tokens * hidden * ffn, 3 * hidden * expert_ffn
    flops = work.layer_flops - mlp_flops + 2 * tokens * (top_k * expert_params + hidden * experts)
    return replace(work, layer_flops=flops,
                   layer_params=work.layer_params - (2 * hidden * ffn + ffn + hidden) + hidden * experts,
                   moe=Experts(experts, top_k, float(experts * expert_params),
                               2 * tokens * (top_k * expert_params + hidden * experts)))


def mlp_workload(layers: int, hidden: int, rows: int, dtype: str = "float32") -> Workload:
    """The pipeline suites' Linear + ReLU stack (``reference.pipeline.model``)."""
    return Workload(layers=layers, layer_flops=2 * rows * hidden * hidden, layer_params=hidden * hidden + hidden,
                    activation_bytes=rows * hidden * BYTES.get(dtype, 4), tokens=rows, vocab_parallel=False,
                    first_layer_input_grad=False, tensors_per_layer=2, dtype=dtype,
                    layer_kind="mlp_layer")


def planned_columns(prediction: dict) -> dict:
    """A prediction as benchmark-row columns."""
    out = {"time_planned_us": prediction["step_s"] * 1e6, "bubble_planned": prediction["bubble_fraction"]}
    out.update({f"plan_{k[:-2]}_us": prediction[k] * 1e6 for k in PARTS})
    return out


def load_profile(path):
    """The profile a sweep predicts with, or None (no prediction) when the sweep was given none."""
    return Profile.load(path) if path else None
