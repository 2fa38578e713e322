"""Ring attention (pass-KV; Liu et al. 2023, the blockwise form of FlashAttention-2): each rank keeps its
queries and passes its key / value block round the context-parallel group; after cp - 1 hops every query
has met every key.

Forward, per rank: for step t = 0 .. cp - 1 it holds the block of rank r - t, posts the send of that block
to rank r + 1 and the receive of rank r - 1's (overlapping the compute), and merges the block into an
online softmax — a running row maximum m, the running sum l of exp(s - m) and the output accumulator
o, each rescaled by exp(m_old - m_new) when the maximum grows; at the end out = o / l and the log-sum-exp
lse = m + log l is kept for backward. The causal mask is by *global* position (q at p attends to k at
p' <= p): a block is full, partial (the diagonal, and zigzag's mixed chunks) or skipped when no query of
this rank may see any of its keys (its compute is skipped; it is still passed on).

Backward recomputes each block's probabilities from lse (p = exp(s - lse)), accumulates dq locally, and
sends the block's dk / dv accumulators round the ring with the block: after cp steps they are home.

Bytes per rank per layer (b batch, s_local tokens per rank, h_kv KV heads of d, e bytes per element; one
block = 2 b h_kv s_local d e for k and v): forward (cp - 1) blocks; backward (cp - 1) blocks of k, v and
cp blocks of dk, dv: (2 cp - 1) blocks. Memory per rank: its own q, k, v, out and lse, two K/V blocks in
flight (the one computed on and the one arriving) and, in backward, two dk / dv accumulators — never the
whole sequence's keys. Grouped-query heads travel as the KV heads they are (expanded to the query heads
only inside a block's compute; their gradient summed back over each group).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _exchange(tensors: list[torch.Tensor], group, send_to: int, recv_from: int):
    """Post the sends of ``tensors`` to ``send_to`` and receives of like tensors from ``recv_from`` (group
    ranks); returns (works, received). One batch, so that a ring of ranks cannot deadlock."""
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), group=group, group_peer=send_to) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=recv_from) for t in received]
    return dist.batch_isend_irecv(ops), received


def _wait(works) -> None:
    for work in works:
        work.wait()


def _scores(q, k, q_pos, k_pos, causal: bool, scale: float, local_mask: bool):
    """(scores with masked entries at -inf, mask or None), or (None, None) when the block is all masked."""
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * scale
    if not causal:
        return s, None
    if local_mask:  # planted: positions within the shard, not in the sequence
        q_pos, k_pos = torch.arange(len(q_pos), device=s.device), torch.arange(len(k_pos), device=s.device)
    allowed = q_pos[:, None] >= k_pos[None, :]
    if not bool(allowed.any()):
        return None, None
    return s.masked_fill(~allowed, float("-inf")), allowed


def _fold(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A gradient over the query heads summed back onto their KV heads."""
    b, h, s, d = t.shape
    return t.view(b, kv_heads, h // kv_heads, s, d).sum(2)


class RingAttention(torch.autograd.Function):
    """forward: softmax(q k^T / sqrt(d) + causal mask) v over the whole sequence, for this rank's queries —
    q (b, h, s_local, d), k and v (b, h_kv, s_local, d) this rank's, ``positions[i]`` rank i's global
    positions; backward: dq, and this rank's dk, dv (the sum of every rank's queries' contributions)."""

    @staticmethod
    def forward(ctx, q, k, v, positions, causal, group, options):
        cp, r = dist.get_world_size(group), dist.get_rank(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        running_max, local_mask = options.get("running_max", True), options.get("local_mask", False)
        q_pos = positions[r]
        b, h, s, d = q.shape
        m = torch.full((b, h, s, 1), float("-inf"), dtype=q.dtype, device=q.device)
        l_sum = torch.zeros((b, h, s, 1), dtype=q.dtype, device=q.device)
        o = torch.zeros_like(q)
        kb, vb = k, v
        for step in range(cp):
            owner = (r - step) % cp
            works, arriving = _exchange([kb, vb], group, (r + 1) % cp, (r - 1) % cp) if step < cp - 1 else ([], None)
            sc, _ = _scores(q, kb, q_pos, positions[owner], causal, scale, local_mask)
            if sc is not None:
                group_size = h // kb.shape[1]
                ve = vb.repeat_interleave(group_size, dim=1)
                if running_max:
                    m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
                    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # no query row seen yet
                    alpha, p = torch.exp(m - safe), torch.exp(sc - safe)
                    m = m_new
                else:  # planted: exp of the raw scores, summed — overflows once a score passes ~709
                    alpha, p = torch.ones_like(m), torch.exp(sc)
                l_sum = l_sum * alpha + p.sum(-1, keepdim=True)
                o = o * alpha + p @ ve
            _wait(works)
            if arriving is not None:
                kb, vb = arriving
        out = o / l_sum
        lse = (m if running_max else torch.zeros_like(m)) + torch.log(l_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.positions, ctx.causal, ctx.group, ctx.local_mask = positions, causal, group, local_mask
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, positions = ctx.group, ctx.positions
        cp, r = dist.get_world_size(group), dist.get_rank(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kb, vb, dkb, dvb = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(cp):
            owner = (r - step) % cp
            sc, _ = _scores(q, kb, positions[r], positions[owner], ctx.causal, scale, ctx.local_mask)
            if sc is not None:
                group_size = q.shape[1] // kb.shape[1]
                ke, ve = kb.repeat_interleave(group_size, dim=1), vb.repeat_interleave(group_size, dim=1)
                p = torch.exp(sc - lse)  # masked entries: exp(-inf) = 0
                dp = dout @ ve.transpose(-1, -2)
                ds = p * (dp - delta)
                dq = dq + ds @ ke * scale
                dkb = dkb + _fold(ds.transpose(-1, -2) @ q * scale, kb.shape[1])
                dvb = dvb + _fold(p.transpose(-1, -2) @ dout, kb.shape[1])
            if cp == 1:
                break
            # the block moves on with its gradient accumulators; after the last step only those, home
            moving = [kb, vb, dkb, dvb] if step < cp - 1 else [dkb, dvb]
            works, arriving = _exchange(moving, group, (r + 1) % cp, (r - 1) % cp)
            _wait(works)
            if step < cp - 1:
                kb, vb, dkb, dvb = arriving
            else:
                dkb, dvb = arriving
        return dq, dkb, dvb, None, None, None, None


def ring_attention(q, k, v, positions: list[torch.Tensor], causal: bool, group, **options) -> torch.Tensor:
    """This rank's attention output (b, h, s_local, d) over the whole sequence (see ``RingAttention``).
    ``options``: ``running_max`` (False: the planted merge without it), ``local_mask`` (True: the planted
    causal mask by local position)."""
    return RingAttention.apply(q, k, v, positions, causal, group, options)
