"""DeepSpeed-Ulysses under the context-parallel contract: ``deepspeed.sequence.layer.DistributedAttention``
— its all-to-alls and its head partition (even, uneven, grouped-query: it splits by the KV heads it reads
off the key tensor) — around the Llama family's attention.

The adapter does what a user's model does around DeepSpeed's layer: the q / k / v / o projections (a
replica of the dense module's), the rotary embedding at each token's global position (the layout's), and
the local attention DeepSpeed calls on its head shard of the whole sequence (grouped-query heads, the
causal mask by global position: the gathered sequence is every rank's shard in rank order). Layout-
agnostic like DeepSpeed itself: contiguous and zigzag alike. Gradients of the replicated projections:
summed over the group (``full_grads``). DeepSpeed asserts kv_heads >= sp (it does not replicate KV heads):
that assertion, and only it, is reported as unsupported with DeepSpeed's sentence."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from harness.contracts import Unsupported


class DeepSpeedUlysses:
    description = "DeepSpeed-Ulysses: deepspeed.sequence.layer.DistributedAttention on CPU/gloo"
    register_group = True
    """Register the CP group as DeepSpeed's sequence-parallel group (as Megatron-DeepSpeed's mpu does)."""

    def shard(self, dense, group, layout: str):
        from deepspeed.utils import groups

        from harness.adapters.deepspeed.init import SequenceParallelGroup, init

        init()
        if self.register_group:  # as Megatron-DeepSpeed's mpu does: this group is the sequence-parallel one
            groups.mpu = SequenceParallelGroup(group)
        return _Ulysses(dense, group, layout)

    def full_grads(self, sharded, group):
        from reference.context_parallel import full_grads

        return full_grads(sharded, group)


class _Ulysses(nn.Module):
    def __init__(self, dense, group, layout: str):
        from deepspeed.sequence.layer import DistributedAttention

        from reference.context_parallel import layout as layouts

        super().__init__()
        if layout not in layouts.LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(layouts.LAYOUTS)}; got {layout!r}.")
        self.group, self.layout, self.cp = group, layout, dist.get_world_size(group)
        self.heads, self.kv_heads, self.head_dim = dense.heads, dense.kv_heads, dense.head_dim
        self.theta, self.causal = dense.theta, getattr(dense, "causal", True)
        self.q, self.k, self.v, self.o = (copy.deepcopy(m) for m in (dense.q, dense.k, dense.v, dense.o))
        # batch-first (b, s, heads, d): heads scattered (dim 2), the sequence gathered (dim 1)
        self.attn = DistributedAttention(self._local, group, scatter_idx=2, gather_idx=1)
        self._every = None

    def _local(self, q, k, v):
        """DeepSpeed's local attention: (b, whole sequence, its heads, d) in, the same shape out."""
        from reference.context_parallel.ulysses import attend_at

        return attend_at(*(t.transpose(1, 2) for t in (q, k, v)), self._every, self.causal).transpose(1, 2)

    def forward(self, x):
        from reference.context_parallel import every_position
        from reference.models.llama import rotate

        b, s, _ = x.shape
        every = every_position(s * self.cp, self.cp, self.layout, x.device)
        self._every = torch.cat(every)
        mine = every[dist.get_rank(self.group)]
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim)
        q = rotate(q.transpose(1, 2), mine, self.theta).transpose(1, 2)
        k = rotate(k.transpose(1, 2), mine, self.theta).transpose(1, 2)
        try:
            out = self.attn(q, k, v, 0)
        except AssertionError as exc:  # its deliberate refusal of fewer KV heads than ranks (no replication)
            # (0.19.8's words; before it, measured at 0.18.0-0.19.4: "Number of heads (1) must be larger than
            # sequence parallel size (4)" — the same refusal, of fewer query heads too)
            if any(w in str(exc) for w in ("must be at least the sequence parallel size",
                                           "must be larger than sequence parallel size")):
                why = str(exc).splitlines()[0]
                raise Unsupported(f"DeepSpeed-Ulysses does not replicate KV heads: {why}") from None
            raise
        return self.o(out.reshape(b, s, self.heads * self.head_dim))
