"""The vocabulary-parallel layers: the embedding table and the output head split by vocabulary rows,
and the cross-entropy that never gathers the logits (Megatron-LM). A vocabulary that does not divide by
the group size is padded, as Megatron pads it, to ceil(V / n) rows per rank; unlike Megatron's loss,
ours masks the padding columns out of the softmax, so the loss is the dense model's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .mappings import (
    copy_to_region,
    gather_from_sequence_region,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
)


class VocabParallelEmbedding(nn.Module):
    """The embedding table split by vocabulary rows; a token's row lives on one rank, the others
    contribute zeros, and an all-reduce assembles the lookup. A vocabulary that does not divide by the
    group size is padded, as Megatron does, to ceil(V / n) rows per rank; padded rows are never looked
    up and stay zero, so they change no result. With ``sequence_parallel`` the lookup is reduce-scattered
    along the sequence (dim 0) instead of all-reduced: each rank keeps its sequence block."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None, dtype=None,
                 sequence_parallel: bool = False):
        super().__init__()
        self.group, self.num_embeddings, self.sequence_parallel = group, num_embeddings, sequence_parallel
        self.vocab_size = num_embeddings
        n, r = dist.get_world_size(group), dist.get_rank(group)
        self.rows_per_rank = -(-num_embeddings // n)
        # The last ranks may hold only padding (e.g. V = 5 over 4 ranks: 2, 2, 1, 0 real rows).
        self.start = min(r * self.rows_per_rank, num_embeddings)
        self.end = min(self.start + self.rows_per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.zeros(self.rows_per_rank, embedding_dim, dtype=dtype))

    @classmethod
    def from_dense(cls, layer: nn.Embedding, group=None, sequence_parallel: bool = False) -> VocabParallelEmbedding:
        self = cls(layer.num_embeddings, layer.embedding_dim, group, layer.weight.dtype, sequence_parallel)
        with torch.no_grad():
            self.weight[: self.end - self.start].copy_(layer.weight[self.start:self.end])
        return self

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.num_embeddings):
            raise ValueError(f"token ids must be in 0..{self.num_embeddings - 1}; got {int(tokens.min())}.."
                             f"{int(tokens.max())}.")
        mine = (tokens >= self.start) & (tokens < self.end)
        local = torch.where(mine, tokens - self.start, torch.zeros_like(tokens))
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_region(out, self.group)
        return reduce_from_region(out, self.group)


IGNORE_INDEX = -100
"""``F.cross_entropy``'s default ``ignore_index``: a padded position's target."""


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary: max, target logit and sum of exponentials are
    all-reduced (3 all-reduces of (tokens,) scalars); the gradient is softmax - one-hot, per shard."""

    @staticmethod
    def forward(ctx, logits, target, start, vocab_size, group):
        n_local = logits.shape[-1]
        valid = torch.arange(start, start + n_local, device=logits.device) < vocab_size  # padding columns
        masked = logits.masked_fill(~valid, float("-inf"))
        logit_max = masked.max(dim=-1).values
        if dist.get_world_size(group) > 1:
            dist.all_reduce(logit_max, op=dist.ReduceOp.MAX, group=group)
        shifted = masked - logit_max.unsqueeze(-1)
        mine = (target >= start) & (target < start + n_local)
        local_t = torch.where(mine, target - start, torch.zeros_like(target))
        # where, not a product: a rank holding only padding gathers -inf, and -inf * 0 is NaN
        predicted = torch.where(mine, shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1), 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if dist.get_world_size(group) > 1:
            dist.all_reduce(predicted, group=group)
            dist.all_reduce(sum_exp, group=group)
        counted = target != IGNORE_INDEX
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), mine, local_t, counted)
        return torch.where(counted, sum_exp.log() - predicted, 0.0)

    @staticmethod
    def backward(ctx, grad):
        softmax, mine, local_t, counted = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local_t.unsqueeze(-1), -mine.to(g.dtype).unsqueeze(-1))
        return g * torch.where(counted, grad, 0.0).unsqueeze(-1), None, None, None, None


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, target: torch.Tensor, vocab_size: int,
                                 group=None) -> torch.Tensor:
    """Per-token cross-entropy (no reduction) of logits whose last dim is this rank's vocabulary shard
    (ceil(V / n) columns, the last rank's padded beyond ``vocab_size``). A target equal to ``IGNORE_INDEX``
    (padding) counts nothing: loss 0 and no gradient, as ``F.cross_entropy(..., reduction="none")``."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    per_rank = -(-vocab_size // n)
    if logits_shard.shape[-1] != per_rank:
        raise ValueError(f"logits shard has {logits_shard.shape[-1]} columns; a vocabulary of {vocab_size} over "
                         f"{n} ranks needs {per_rank} per rank.")
    return _VocabParallelCrossEntropy.apply(logits_shard, target, r * per_rank, vocab_size, group)


def fp32_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits a cross-entropy reads: a low-precision (bfloat16 / float16) model's upcast to fp32 —
    Megatron's default (``fp16_lm_cross_entropy=False``) — others as they are."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


class ParallelLMHead(nn.Module):
    """The output projection hidden -> vocabulary, column-parallel over ceil(V / n) rows per rank (padding
    rows zero), followed by ``vocab_parallel_cross_entropy``: per-token loss, full on every rank. With
    ``sequence_parallel`` the input is this rank's sequence block and is all-gathered first.
    Communication: the CE's three (tokens,) all-reduces forward; the input gradient's all-reduce
    (reduce-scatter with sequence parallelism) backward."""

    def __init__(self, hidden: int, vocab_size: int, group=None, sequence_parallel: bool = False, dtype=None):
        super().__init__()
        self.group, self.vocab_size, self.sequence_parallel = group, vocab_size, sequence_parallel
        n, r = dist.get_world_size(group), dist.get_rank(group)
        self.rows_per_rank = -(-vocab_size // n)
        self.start = min(r * self.rows_per_rank, vocab_size)
        self.end = min(self.start + self.rows_per_rank, vocab_size)
        self.weight = nn.Parameter(torch.zeros(self.rows_per_rank, hidden, dtype=dtype))

    @classmethod
    def from_dense(cls, layer: nn.Linear, group=None, sequence_parallel: bool = False) -> ParallelLMHead:
        if layer.bias is not None:
            raise ValueError("the LM head is a Linear without bias (as in GPT); this one has a bias.")
        self = cls(layer.in_features, layer.out_features, group, sequence_parallel, dtype=layer.weight.dtype)
        with torch.no_grad():
            self.weight[: self.end - self.start].copy_(layer.weight[self.start:self.end])
        return self

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = gather_from_sequence_region(x, self.group) if self.sequence_parallel else copy_to_region(x, self.group)
        return vocab_parallel_cross_entropy(fp32_logits(F.linear(x, self.weight)), target, self.vocab_size, self.group)
