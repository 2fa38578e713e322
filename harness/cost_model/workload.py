"""What a step computes and holds, per layer, for the predictor (``harness.cost_model.predict``): the reference
GPT's, Llama's and MoE's workloads and the pipeline suites' MLP, from their sizes."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
