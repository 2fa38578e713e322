"""How each family's block splits over a tensor-parallel group — beside the families, not inside the stack
(``reference.stack.compose`` asks ``tp_block`` for the block of whichever family it trains).

- GPT: attention heads and the GELU MLP split (``ParallelAttention``, ``ParallelMLP``), LayerNorms and
  dropout replicated.
- Llama: query heads split; key/value heads split where tp divides kv_heads, and where kv_heads < tp
  (tp a multiple of it) each KV head is **replicated** over the tp / kv_heads ranks whose query heads read
  it — its gradient summed over those replicas in backward (Megatron and vLLM do this; a missing sum is a
  classic silent bug); SwiGLU's gate and up column-parallel, down row-parallel; RMSNorms replicated. A tp
  that neither divides nor is a multiple of kv_heads is refused in one sentence.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..tensor_parallel import ColumnParallelLinear, ParallelAttention, ParallelMLP, RowParallelLinear
from ..tensor_parallel.layers import project
from ..tensor_parallel.mappings import copy_to_region
from .gpt import GPTBlock
from .llama import LlamaBlock, attend_gqa


class ParallelGPTBlock(nn.Module):
    def __init__(self, block: GPTBlock, tp_group):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn = ParallelAttention.from_dense(block.attn, tp_group)
        self.mlp = ParallelMLP.from_dense(block.fc1, block.fc2, tp_group)
        self.drop_attn, self.drop_mlp = copy.deepcopy(block.drop_attn), copy.deepcopy(block.drop_mlp)

    def forward(self, x):
        x = x + self.drop_attn(self.attn(self.ln1(x).transpose(0, 1)).transpose(0, 1))
        return x + self.drop_mlp(self.mlp(self.ln2(x)))


class _SumOverReplicas(torch.autograd.Function):
    """forward: identity (this rank's copy of KV head ``slot``); backward: the sum of the gradients of
    every replica of that head — a TP all-reduce of a kv_heads-slot buffer in which each rank writes its
    own head's slot (replicas of one head write the same slot: they add up)."""

    @staticmethod
    def forward(ctx, weight, slot: int, slots: int, group):
        ctx.slot, ctx.slots, ctx.group = slot, slots, group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        rows = grad.shape[0]
        full = grad.new_zeros((ctx.slots * rows, *grad.shape[1:]))
        full[ctx.slot * rows:(ctx.slot + 1) * rows] = grad
        dist.all_reduce(full, group=ctx.group)
        return full[ctx.slot * rows:(ctx.slot + 1) * rows].clone(), None, None, None


class ParallelGQAttention(nn.Module):
    """Grouped-query attention over a TP group: this rank's heads / tp query heads and the KV heads they
    read. Communication per layer: the input's copy_to_region (an all-reduce of the input gradient in
    backward), the row-parallel output's all-reduce forward, and where KV heads are replicated one
    all-reduce of kv_heads x head_dim x hidden per K and V weight in backward."""

    def __init__(self, dense, group):
        super().__init__()
        tp, r = dist.get_world_size(group), dist.get_rank(group)
        heads, kv = dense.heads, dense.kv_heads
        check_heads(heads, kv, tp)
        self.group, self.theta, self.head_dim = group, dense.theta, dense.head_dim
        self.local_heads, self.kv_slots = heads // tp, kv
        self.core = None
        """The attention core (q, k, v, positions) -> (b, s, heads d): None is ``attend_gqa`` over this rank's
        whole sequence; context parallelism sets its own (``reference.context_parallel.ContextParallelCore``)."""
        self.q = ColumnParallelLinear.from_dense(dense.q, group)
        self.o = RowParallelLinear.from_dense(dense.o, group)
        self.replicas = tp // kv if kv < tp else 1
        """How many TP ranks hold each KV head (1: the KV heads are split, not replicated)."""
        if self.replicas == 1:
            self.k, self.v = (ColumnParallelLinear.from_dense(lin, group) for lin in (dense.k, dense.v))
            self.local_kv, self.slot = kv // tp, None
        else:  # this rank's query heads all read KV head r // replicas: hold a copy of its rows
            self.slot, self.local_kv, d = r // self.replicas, 1, dense.head_dim
            rows = slice(self.slot * d, (self.slot + 1) * d)
            self.k, self.v = (nn.Linear(lin.in_features, d, bias=False, dtype=lin.weight.dtype,
                                        device=lin.weight.device) for lin in (dense.k, dense.v))
            with torch.no_grad():
                self.k.weight.copy_(dense.k.weight[rows])
                self.v.weight.copy_(dense.v.weight[rows])
            self.k.weight.kv_replica_first = self.v.weight.kv_replica_first = r % self.replicas == 0
            self.k.weight.kv_slot = self.v.weight.kv_slot = (self.slot, kv)  # its rows of the dense K / V

    def _kv_weight(self, lin) -> torch.Tensor:
        if self.replicas == 1:
            return lin.weight
        return _SumOverReplicas.apply(lin.weight, self.slot, self.kv_slots, self.group)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_region(x, self.group)

        def heads_of(t, n):
            return t.view(b, s, n, self.head_dim).transpose(1, 2)

        q = heads_of(project(self.q, x), self.local_heads)
        k = heads_of(project(self.k, x, self._kv_weight(self.k)), self.local_kv)
        v = heads_of(project(self.v, x, self._kv_weight(self.v)), self.local_kv)
        core = self.core if self.core is not None else (lambda *a: attend_gqa(*a, self.theta))
        return self.o(core(q, k, v, positions))


class ParallelSwiGLU(nn.Module):
    """gate and up column-parallel (this rank's ffn / tp), down row-parallel: one all-reduce forward (the
    output) and one backward (the input)."""

    def __init__(self, dense, group):
        super().__init__()
        self.group = group
        self.gate, self.up = (ColumnParallelLinear.from_dense(lin, group) for lin in (dense.gate, dense.up))
        self.down = RowParallelLinear.from_dense(dense.down, group)

    def forward(self, x):
        x = copy_to_region(x, self.group)
        return self.down(F.silu(project(self.gate, x)) * project(self.up, x))


class ParallelLlamaBlock(nn.Module):
    def __init__(self, block: LlamaBlock, tp_group):
        super().__init__()
        self.attn_norm, self.mlp_norm = copy.deepcopy(block.attn_norm), copy.deepcopy(block.mlp_norm)
        self.attn = ParallelGQAttention(block.attn, tp_group)
        self.mlp = ParallelSwiGLU(block.mlp, tp_group)

    def forward(self, x, positions: torch.Tensor | None = None):
        positions = positions if positions is not None else torch.arange(x.shape[1], device=x.device)
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class ParallelMoEBlock(nn.Module):
    """The MoE family's block over a TP group: the attention split as the Llama family's, the norms and the
    mixture of experts replicated over TP (every TP rank routes and computes the same tokens; expert
    parallelism splits the experts over the data x context parallel ranks: ``reference.stack.dimensions.
    expert_parallel``)."""

    def __init__(self, block, tp_group):
        from ..expert_parallel.stack import StackMoE

        super().__init__()
        self.attn_norm, self.mlp_norm = copy.deepcopy(block.attn_norm), copy.deepcopy(block.mlp_norm)
        self.attn = ParallelGQAttention(block.attn, tp_group)
        self.moe = StackMoE(block.moe)

    def forward(self, x, positions: torch.Tensor | None = None):
        positions = positions if positions is not None else torch.arange(x.shape[1], device=x.device)
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.moe(self.mlp_norm(x))


def check_heads(heads: int, kv_heads: int, tp: int) -> None:
    """One sentence for a tp the attention cannot be split over: tp must divide the query heads, and
    divide the KV heads or be a multiple of them (each KV head then replicated tp / kv_heads times)."""
    if heads % tp:
        raise ValueError(f"tp ({tp}) must divide the attention heads ({heads}).")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tp ({tp}) must divide kv_heads ({kv_heads}) or be a multiple of it (each KV head then "
                         f"replicated tp / kv_heads times); {tp} and {kv_heads} are neither.")


def tp_block(block: nn.Module, tp_group) -> nn.Module:
    """``block`` of any family, split over ``tp_group``."""
    from .moe_llama import MoEBlock

    if isinstance(block, MoEBlock):
        return ParallelMoEBlock(block, tp_group)
    if isinstance(block, LlamaBlock):
        return ParallelLlamaBlock(block, tp_group)
    if isinstance(block, GPTBlock):
        return ParallelGPTBlock(block, tp_group)
    raise ValueError(f"no tensor-parallel split for a {type(block).__name__}: the stack trains the gpt, llama "
                     "and moe families.")


def counted_here(module: nn.Module) -> list[nn.Parameter]:
    """Parameters replicated over part of the TP group (a KV head's copies) that this rank counts — once
    per head, on its first replica — in a global gradient norm."""
    return [p for p in module.parameters() if getattr(p, "kv_replica_first", False)]


def tp_split_matrices(module: nn.Module) -> dict:
    """{id(weight): (dim, group, replicas)} of the linear weights of ``module`` split over a TP group of more than
    one rank: a column-parallel weight's rows (dim 0), a row-parallel weight's columns (dim 1), group rank r holding
    block r // replicas — replicas 1, or a grouped-query attention's K and V with fewer KV heads than ranks
    (``reference.models.sharding.ParallelGQAttention``: tp / kv consecutive ranks hold one KV head's rows). What a
    matrix optimizer gathers to see the whole (``reference.muon.optimizer``)."""
    found = {}
    for mod in module.modules():
        if isinstance(mod, ColumnParallelLinear | RowParallelLinear) and dist.get_world_size(mod.group) > 1:
            found[id(mod.weight)] = (0 if isinstance(mod, ColumnParallelLinear) else 1, mod.group, 1)
        elif isinstance(mod, ParallelGQAttention) and mod.slot is not None:
            found.update({id(lin.weight): (0, mod.group, mod.replicas) for lin in (mod.k, mod.v)})
    return found
