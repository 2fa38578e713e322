"""The GPT family on one device (and the small models the ZeRO and pipeline suites train): batch-first
(batch, ..., features) activations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..dropout import DropoutKey, KeyedDropout


def mlp(sizes: tuple[int, ...] = (4, 5, 3), dtype=torch.float64) -> nn.Sequential:
    """Linear-GELU-...-Linear. The default has 43 parameters (4*5 + 5 + 5*3 + 3): a prime, so no data-
    parallel size > 1 divides it and every ZeRO shard boundary needs padding."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers += [nn.Linear(a, b, dtype=dtype)] + ([nn.GELU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(LN(x)), then + MLP(LN(.)) with GELU; (batch, seq, hidden)."""

    def __init__(self, hidden: int = 8, heads: int = 2, ffn: int = 16, dtype=torch.float64):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}).")
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden, dtype=dtype), nn.LayerNorm(hidden, dtype=dtype)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden, dtype=dtype), nn.Linear(hidden, hidden, dtype=dtype)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn, dtype=dtype), nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(h // self.heads), dim=-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTBlock(nn.Module):
    """Pre-norm causal block on (batch, seq, hidden): x + drop(attn(LN(x))), then + drop(MLP(LN(.))) with
    GELU. The attention is ``DenseAttention`` (seq-first, q/k/v/o Linears) so tensor parallelism shards it
    as is; the dropouts are ``reference.dropout.KeyedDropout`` (identity at ``dropout`` 0)."""

    def __init__(self, hidden: int, heads: int, ffn: int, dtype=torch.float64, dropout: float = 0.0,
                 key: DropoutKey | None = None, layer: int = 0):
        super().__init__()
        from ..tensor_parallel import DenseAttention

        key = key if key is not None else DropoutKey()
        self.ln1, self.ln2 = nn.LayerNorm(hidden, dtype=dtype), nn.LayerNorm(hidden, dtype=dtype)
        self.attn = DenseAttention(hidden, heads, dtype=dtype, causal=True)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn, dtype=dtype), nn.Linear(ffn, hidden, dtype=dtype)
        self.drop_attn = KeyedDropout(dropout, key, layer, "attn")
        self.drop_mlp = KeyedDropout(dropout, key, layer, "mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_attn(self.attn(self.ln1(x).transpose(0, 1)).transpose(0, 1))
        return x + self.drop_mlp(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    """A small GPT: token embedding, ``layers`` causal blocks, final LayerNorm, a bias-free LM head.
    ``loss(tokens, targets)`` is the mean cross-entropy over every token. ``dropout`` > 0: keyed dropout
    (``reference.dropout``) after the embedding and in every block; set ``dropout_key.step`` before each
    training step (the masks are drawn from (dropout_seed, step, layer, site, sample)).
    ``tie_embeddings``: the LM head's weight is the input embedding's (one parameter, as most LLMs)."""

    def __init__(self, vocab: int = 13, hidden: int = 16, heads: int = 8, ffn: int = 32, layers: int = 4,
                 dtype=torch.float64, *, dropout: float = 0.0, dropout_seed: int = 0, tie_embeddings: bool = False):
        super().__init__()
        self.vocab, self.heads, self.dropout_key = vocab, heads, DropoutKey(dropout_seed)
        self.embed = nn.Embedding(vocab, hidden, dtype=dtype)
        self.drop_embed = KeyedDropout(dropout, self.dropout_key, -1, "embed")
        self.blocks = nn.ModuleList(GPTBlock(hidden, heads, ffn, dtype, dropout, self.dropout_key, i)
                                    for i in range(layers))
        self.ln_f = nn.LayerNorm(hidden, dtype=dtype)
        self.head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        self.tie_embeddings = tie_embeddings
        if tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop_embed(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from ..tensor_parallel.vocab import fp32_logits  # the LM head's rule: low precision in fp32

        return F.cross_entropy(fp32_logits(self(tokens)).flatten(0, 1), targets.flatten())
