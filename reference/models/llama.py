"""The Llama family on one device: RMSNorm, rotary position embedding (rotate-half), a SwiGLU MLP and
grouped-query attention, no biases, the LM head untied by default. Activations are batch-first (batch,
seq, hidden). Positions are passed in explicitly (default 0 .. seq - 1), so that a rank holding a shard
of the sequence rotates at its global offsets.

Parameter names (what every stack reports in): ``embed``, ``blocks.<i>.attn_norm``, ``blocks.<i>.attn.
{q,k,v,o}``, ``blocks.<i>.mlp_norm``, ``blocks.<i>.mlp.{gate,up,down}``, ``ln_f`` (the final RMSNorm),
``head``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..dropout import DropoutKey


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, the mean over the last dimension (Zhang & Sennrich 2019)."""

    def __init__(self, hidden: int, eps: float = 1e-5, dtype=torch.float64):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding, rotate-half form (GPT-NeoX, Llama): x (batch, heads, seq, d) at
    ``positions`` (seq,): x cos(p f) + rotate_half(x) sin(p f), f_i = theta^(-2i/d), i < d/2, with
    rotate_half(x) = (-x[d/2:], x[:d/2])."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(x.dtype) for f in (torch.cos, torch.sin))
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


def attend_gqa(q, k, v, positions: torch.Tensor, theta: float, causal: bool = True) -> torch.Tensor:
    """Grouped-query attention core: q (batch, heads, seq, d), k and v (batch, kv_heads, seq, d), heads a
    multiple of kv_heads (query head h reads KV head h // (heads / kv_heads)); rotary on q and k; causal
    by position. Returns (batch, seq, heads * d)."""
    b, heads, s, d = q.shape
    q, k = rotate(q, positions, theta), rotate(k, positions, theta)
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, heads * d)


class GQAttention(nn.Module):
    """q: hidden -> heads * d, k and v: hidden -> kv_heads * d, o: heads * d -> hidden; no biases; causal
    unless ``causal`` is False (an encoder's attention)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, theta: float = 10000.0, dtype=torch.float64,
                 causal: bool = True):
        super().__init__()
        self.causal = causal
        if hidden % heads or heads % kv_heads:
            raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads}).")
        d = hidden // heads
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, d, theta
        self.q = nn.Linear(hidden, heads * d, bias=False, dtype=dtype)
        self.k = nn.Linear(hidden, kv_heads * d, bias=False, dtype=dtype)
        self.v = nn.Linear(hidden, kv_heads * d, bias=False, dtype=dtype)
        self.o = nn.Linear(heads * d, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def heads_of(t, n):
            return t.view(b, s, n, self.head_dim).transpose(1, 2)

        q = heads_of(self.q(x), self.heads)
        k, v = heads_of(self.k(x), self.kv_heads), heads_of(self.v(x), self.kv_heads)
        return self.o(attend_gqa(q, k, v, positions, self.theta, self.causal))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020); no biases."""

    def __init__(self, hidden: int, ffn: int, dtype=torch.float64):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.up = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.down = nn.Linear(ffn, hidden, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    """x + attn(RMSNorm(x)), then + SwiGLU(RMSNorm(.))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, theta: float, eps: float, dtype):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(hidden, eps, dtype), RMSNorm(hidden, eps, dtype)
        self.attn = GQAttention(hidden, heads, kv_heads, theta, dtype)
        self.mlp = SwiGLU(hidden, ffn, dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        positions = positions if positions is not None else torch.arange(x.shape[1], device=x.device)
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Token embedding, ``layers`` Llama blocks, a final RMSNorm (``ln_f``), an LM head (untied unless
    ``tie_embeddings``). ``loss(tokens, targets)``: the mean cross-entropy over every token."""

    def __init__(self, vocab: int = 13, hidden: int = 16, heads: int = 4, kv_heads: int = 2, ffn: int = 24,
                 layers: int = 4, rope_theta: float = 10000.0, norm_eps: float = 1e-5, dtype=torch.float64, *,
                 tie_embeddings: bool = False, block=None):
        """``block``: a zero-argument factory of one block (default: a ``LlamaBlock`` of these sizes; the MoE
        family's ``MoEBlock``), called ``layers`` times in place."""
        super().__init__()
        self.vocab, self.heads, self.kv_heads, self.rope_theta = vocab, heads, kv_heads, rope_theta
        self.dropout_key = DropoutKey()  # the family has no dropout; the stacks key it all the same
        self.embed = nn.Embedding(vocab, hidden, dtype=dtype)
        block = block or (lambda: LlamaBlock(hidden, heads, kv_heads, ffn, rope_theta, norm_eps, dtype))
        self.blocks = nn.ModuleList(block() for _ in range(layers))
        self.ln_f = RMSNorm(hidden, norm_eps, dtype)
        self.head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        self.tie_embeddings = tie_embeddings
        if tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.ln_f(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from ..tensor_parallel.vocab import fp32_logits

        return F.cross_entropy(fp32_logits(self(tokens)).flatten(0, 1), targets.flatten())
