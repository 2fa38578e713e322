"""The MoE family on one device: the Llama family with every block's SwiGLU replaced by a mixture of experts
(``reference.models.moe.MoE``: a router, E routed SwiGLU experts, optional shared experts).

Loss: the mean cross-entropy over every token + ``aux_coef`` x the sum over layers of the **sequence-wise**
load-balancing loss, averaged over the batch's sequences (each sequence's E x sum_i f_i P_i over its own
tokens: DeepSeek-V3's complementary sequence-wise loss). Why per sequence and not over the batch: a whole
trainer sees the batch in micro-batches, split over data-parallel replicas and pipelined (a micro-batch's
backward starts before the last one's forward) — a per-sequence loss is the same number however the batch
is cut, so every layout can be held to this one device; a batch-wide f_i is not known until every micro-batch
has been routed. Under context parallelism a sequence's counts and probabilities are summed over its ranks.

With the sigmoid router each layer's selection bias (DeepSeek-V3's auxiliary-loss-free balancing: added to the
scores for the choice only) is fixed at 0.3 x a standard normal draw from its own generator (the weights' draw
is unchanged) — DeepSeek-V3 moves it between steps by a balancing rule, which this family does not model; a
zero bias would leave the path that reads it untested.

Parameter names: the Llama family's, with ``blocks.<i>.moe.router``, ``blocks.<i>.moe.experts.<e>.{gate,up,
down}``, ``blocks.<i>.moe.shared.{gate,up,down}`` (shared experts: one SwiGLU of ``shared`` x ffn) in place
of ``blocks.<i>.mlp``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .llama import GQAttention, Llama, RMSNorm
from .moe import MoE, routed_sum, routing_gap, row_balance, row_balance_loss, selection_bias


class MoEBlock(nn.Module):
    """x + attn(RMSNorm(x)), then + MoE(RMSNorm(.)); ``run`` also returns the block's sequence-wise
    balance loss, one per sequence (rows,)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, theta: float, eps: float, dtype, *,
                 experts: int, top_k: int, shared: int, scoring: str, renormalize: bool = True):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(hidden, eps, dtype), RMSNorm(hidden, eps, dtype)
        self.attn = GQAttention(hidden, heads, kv_heads, theta, dtype)
        self.moe = MoE(hidden, ffn, experts, top_k, shared, scoring, renormalize, dtype=dtype)

    def run(self, x: torch.Tensor, positions: torch.Tensor | None = None,
            margins: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``margins``: where to append this block's smallest routing gap (``MoELlama.routing_margin``)."""
        b, s, h = x.shape
        positions = positions if positions is not None else torch.arange(s, device=x.device)
        x = x + self.attn(self.attn_norm(x), positions)
        flat = self.mlp_norm(x).reshape(b * s, h)
        weights, experts, balance = self.moe.route(flat)
        if margins is not None:
            margins.append(routing_gap(self.moe, flat))
        y = routed_sum(flat, weights, experts, self.moe.experts)
        if self.moe.shared is not None:
            y = y + self.moe.shared(flat)
        counts, psum = row_balance(balance, experts, b, self.moe.num_experts)
        return x + y.view(b, s, h), row_balance_loss(counts, psum, s, self.moe.top_k)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.run(x, positions)[0]


class MoELlama(Llama):
    """The Llama with MoE blocks: token embedding, ``layers`` MoE blocks, a final RMSNorm, an LM head.
    ``loss(tokens, targets)``: the mean cross-entropy + aux_coef x sum over layers of the mean over sequences of
    their balance loss."""

    def __init__(self, vocab: int, hidden: int, heads: int, kv_heads: int, ffn: int, layers: int,
                 rope_theta: float, norm_eps: float, dtype, *, experts: int, top_k: int, shared: int = 0,
                 scoring: str = "softmax", renormalize: bool = True, aux_coef: float = 0.01,
                 tie_embeddings: bool = False):
        super().__init__(vocab, hidden, heads, kv_heads, ffn, layers, rope_theta, norm_eps, dtype,
                         tie_embeddings=tie_embeddings,
                         block=lambda: MoEBlock(hidden, heads, kv_heads, ffn, rope_theta, norm_eps, dtype,
                                                experts=experts, top_k=top_k, shared=shared, scoring=scoring,
                                                renormalize=renormalize))
        self.aux_coef = aux_coef
        if scoring == "sigmoid":  # a fixed selection bias per layer (see the module docstring)
            gen = torch.Generator().manual_seed(4242)
            for block in self.blocks:
                block.moe.bias.copy_(selection_bias(experts, gen).to(block.moe.bias.dtype))

    def run(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, the sum over layers of the mean over sequences of the balance loss)."""
        x, aux = self.embed(tokens), 0.0
        for block in self.blocks:
            x, rows = block.run(x)
            aux = aux + rows.mean()
        return self.head(self.ln_f(x)), aux

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from ..tensor_parallel.vocab import fp32_logits

        logits, aux = self.run(tokens)
        return F.cross_entropy(fp32_logits(logits).flatten(0, 1), targets.flatten()) + self.aux_coef * aux

    def routing_margin(self, tokens: torch.Tensor) -> float:
        """The smallest gap, over every token and layer, between the k-th and the (k+1)-th routing score the
        choice is made by: near 0, a rounding difference could flip a choice (a tie), and no stack would be
        comparable to this device — the cases check it is far from 0."""
        x, margins = self.embed(tokens), []
        with torch.no_grad():
            for block in self.blocks:
                x, _ = block.run(x, margins=margins)
        return min(margins, default=float("inf"))
