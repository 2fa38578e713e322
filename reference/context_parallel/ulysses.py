"""Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all turns sequence shards into head shards —
each rank then holds h / cp heads over the whole sequence and attends as one device would — and the inverse
all-to-all turns the output back into sequence shards.

Heads: the query heads split into cp equal groups (rank j: heads [j h / cp, (j + 1) h / cp)); a head count
cp does not divide is refused in one sentence (never a split like [4, 4, 4, 0]). Grouped-query KV heads:
kv_heads >= cp — split into cp groups the same way (kv_heads a multiple of cp, so each rank's query heads
read exactly its own KV heads); kv_heads < cp — each KV head replicated cp / kv_heads times so that every
rank holds the one its query heads read, its gradient summed over the replicas (the replication's
backward); anything else refused.

The gathered sequence is every rank's shard in rank order (not the global order): the causal mask reads
each token's global position, so the order does not matter.

Bytes per rank per layer (b batch, s_local tokens, d head dim, e bytes; one all-to-all of a tensor of n
heads sends (cp - 1) / cp of its b n s_local d e bytes): forward q (h), k and v (max(kv_heads, cp)) and the
output (h); backward the same four back. Memory per rank: h / cp heads of the whole sequence's q, k, v
and scores — the sequence is whole here, the heads are not.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def check_heads(heads: int, kv_heads: int, cp: int) -> None:
    if heads % cp:
        raise ValueError(f"the {heads} query heads do not split evenly over cp = {cp}: Ulysses gives every rank "
                         f"heads / cp of them; choose a cp that divides {heads}.")
    if kv_heads % cp and cp % kv_heads:
        raise ValueError(f"the {kv_heads} KV heads can neither be split over cp = {cp} nor replicated onto it; "
                         "cp must divide them or be a multiple of them.")


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Part i of dim 0 to rank i; returns what every rank sent (part j from rank j). Contiguous both ways."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class SeqToHeads(torch.autograd.Function):
    """forward: (b, H, s_local, d) sequence shard -> (b, H / cp, cp s_local, d) head shard (all-to-all);
    backward: the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, ctx.group, False), None


class HeadsToSeq(torch.autograd.Function):
    """forward: (b, H / cp, cp s_local, d) -> (b, H, s_local, d) (all-to-all); backward: the inverse."""

    @staticmethod
    def forward(ctx, x, group, reversed_heads=False):
        ctx.group, ctx.reversed_heads = group, reversed_heads
        return _heads_to_seq(x, group, reversed_heads)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, ctx.group, ctx.reversed_heads), None, None


def _seq_to_heads(x, group, reversed_heads: bool = False):
    cp = dist.get_world_size(group)
    b, h, s, d = x.shape
    parts = x.reshape(b, cp, h // cp, s, d).transpose(0, 1)  # (cp, b, h / cp, s, d): part j to rank j
    if reversed_heads:
        parts = parts.flip(0)
    got = _all_to_all(parts, group)  # got[i]: rank i's tokens of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _heads_to_seq(x, group, reversed_heads: bool):
    cp = dist.get_world_size(group)
    b, hl, s_all, d = x.shape
    parts = x.reshape(b, hl, cp, s_all // cp, d).permute(2, 0, 1, 3, 4)  # part i: rank i's tokens
    got = _all_to_all(parts, group)  # got[j]: my tokens of rank j's heads
    if reversed_heads:  # planted: the head groups put back in the wrong order
        got = got.flip(0)
    return got.transpose(0, 1).reshape(b, cp * hl, s_all // cp, d)


class _ReplicateNoSum(torch.autograd.Function):
    """Planted: the KV replicas' forward, with each KV head's gradient taken from its first replica only."""

    @staticmethod
    def forward(ctx, x, times):
        ctx.times = times
        return x.repeat_interleave(times, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ::ctx.times].clone(), None


def ulysses_attention(q, k, v, positions: list[torch.Tensor], causal: bool, group, *, reversed_heads: bool = False,
                      replicas_summed: bool = True) -> torch.Tensor:
    """This rank's attention output (b, h, s_local, d) over the whole sequence: q (b, h, s_local, d), k and v
    (b, kv_heads, s_local, d) this rank's tokens (already rotated at their global positions);
    ``positions[i]``: rank i's global positions. ``reversed_heads`` / ``replicas_summed=False``: planted."""
    cp = dist.get_world_size(group)
    heads, kv = q.shape[1], k.shape[1]
    check_heads(heads, kv, cp)
    if kv < cp:  # each KV head replicated onto cp / kv ranks (its gradient summed by repeat_interleave)
        times = cp // kv
        rep = (lambda t: t.repeat_interleave(times, dim=1)) if replicas_summed else \
            (lambda t: _ReplicateNoSum.apply(t, times))
        k, v = rep(k), rep(v)
    qh, kh, vh = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = attend_at(qh, kh, vh, torch.cat(list(positions)), causal)  # every rank's shard, in rank order
    return HeadsToSeq.apply(out, group, reversed_heads)


def attend_at(q, k, v, positions: torch.Tensor, causal: bool) -> torch.Tensor:
    """Softmax attention over a whole (gathered) sequence whose tokens sit at ``positions`` (any order):
    q (b, h, s, d), k and v (b, h_kv, s, d) with h a multiple of h_kv (query head i reads KV head
    i // (h / h_kv)); causal by position. Returns (b, h, s, d)."""
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.repeat_interleave(group, dim=1)
