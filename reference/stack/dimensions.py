"""The dimensions of the reference stack, one function each, applied in one ordered pass over a family's
model (``reference.stack.compose`` makes the pass): ``tensor_parallel`` -> ``context_parallel`` ->
``expert_parallel`` -> ``activation_checkpointing`` -> ``pipeline_split`` -> ``data_parallel`` (torchtitan's
order). Each takes the model's ``Pieces`` and returns
them transformed — the one-device model is never modified; which module of a family splits how lives
beside the family (``reference.models.sharding``)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from reference.checkpoint import Checkpointed
from reference.context_parallel import ContextParallelCore
from reference.data_parallel import NaiveDataParallel
from reference.dropout import DropoutKey, KeyedDropout
from reference.mixed_precision import MixedPrecisionZero
from reference.mixed_precision.zero import LOW
from reference.models import GPT
from reference.models.sharding import ParallelGQAttention, tp_block, tp_split_matrices
from reference.stack.topology import ParallelDims, coordinates
from reference.tensor_parallel import ParallelLMHead, VocabParallelEmbedding
from reference.zero import OptimizerSpec, ShardedOptimizer


class Stage(nn.Module):
    """Contiguous blocks; the first stage also embeds, the last also normalises and holds the LM head —
    applied in forward when ``apply_head``, else called by the pipeline's loss function (its parameters
    are this stage's either way)."""

    def __init__(self, blocks, embed=None, ln_f=None, head=None, apply_head: bool = False, drop_embed=None):
        super().__init__()
        self.embed, self.blocks, self.ln_f, self.head = embed, nn.ModuleList(blocks), ln_f, head
        self.drop_embed, self.apply_head = drop_embed, apply_head

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
            x = self.drop_embed(x) if self.drop_embed is not None else x
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x) if self.ln_f is not None else x
        return self.head(x) if self.apply_head and self.head is not None else x


def stage_bounds(num_blocks: int, num_stages: int) -> list[int]:
    """Stage s holds blocks [bounds[s], bounds[s + 1]): contiguous, earlier stages take the extra block."""
    base, extra = divmod(num_blocks, num_stages)
    return [s * base + min(s, extra) for s in range(num_stages + 1)]


@dataclass
class Pieces:
    """A family's model as the dimensions transform it, in order: what embeds, the blocks, the final norm,
    the LM head. Each dimension's function takes the pieces and returns them transformed (new modules; the
    one-device model is never modified)."""

    embed: nn.Module
    blocks: list
    ln_f: nn.Module
    head: nn.Module
    drop_embed: nn.Module | None = None


def pieces_of(model) -> Pieces:
    """The one-device model's pieces, as they are (GPT and Llama alike: ``embed``, ``blocks``, ``ln_f``,
    ``head``)."""
    return Pieces(model.embed, list(model.blocks), model.ln_f, model.head, getattr(model, "drop_embed", None))


def tensor_parallel(pieces: Pieces, tp_group) -> Pieces:
    """Each block split as its family says (``reference.models.sharding.tp_block``), the embedding and the
    LM head vocabulary-parallel, the final norm (and embedding dropout) replicated."""
    return Pieces(VocabParallelEmbedding.from_dense(pieces.embed, tp_group),
                  [tp_block(b, tp_group) for b in pieces.blocks], copy.deepcopy(pieces.ln_f),
                  ParallelLMHead.from_dense(pieces.head, tp_group), copy.deepcopy(pieces.drop_embed))


def context_parallel(pieces: Pieces, cp_group, layout: str = "zigzag", algorithm: str = "ring") -> Pieces:
    """Every block's attention core over the CP group (``reference.context_parallel``: ring attention by
    default, the zigzag layout): each rank holds its sequence shard of every activation, rotates and masks
    at global positions, and attends over the whole sequence; everything else in a block is per token. The
    Llama family only (its grouped-query attention with rotary positions); ``cp_group`` None: unchanged.
    The blocks are ``tensor_parallel``'s (new modules): their cores are set in place."""
    if cp_group is None:
        return pieces
    for block in pieces.blocks:
        attn = getattr(block, "attn", None)
        if not isinstance(attn, ParallelGQAttention):
            raise ValueError("context parallelism splits the Llama family's attention (grouped-query heads, rotary "
                             "positions); this model's blocks are not Llama blocks.")
        attn.core = ContextParallelCore(cp_group, layout, algorithm, attn.theta)
    return pieces


def expert_parallel(pieces: Pieces, ep_group, cp_group) -> Pieces:
    """Every MoE block's experts split over the EP group (``reference.expert_parallel.stack.StackMoE``: tokens
    dispatched by all-to-all to their experts' ranks and combined back), and its sequence-wise balance loss
    summed over the CP group (a sequence's tokens are spread over it). Blocks without a mixture of experts
    are unchanged; so is everything with neither group."""
    from reference.expert_parallel.stack import StackMoE

    if ep_group is None and cp_group is None:
        return pieces
    for block in pieces.blocks:
        if isinstance(getattr(block, "moe", None), StackMoE):
            block.moe = StackMoE(block.moe, ep_group, cp_group)
    return pieces


def activation_checkpointing(pieces: Pieces, enabled: bool) -> Pieces:
    """Every block recomputed in backward (``reference.checkpoint``; recomputation reruns its TP collectives,
    in the same order on every TP rank)."""
    if not enabled:
        return pieces
    return Pieces(pieces.embed, [Checkpointed(b) for b in pieces.blocks], pieces.ln_f, pieces.head, pieces.drop_embed)


def pipeline_split(pieces: Pieces, dims: ParallelDims, rank: int, virtual: int,
                   place: tuple[int, ...] | None = None) -> dict[int, Stage]:
    """This rank's stages {index: Stage}: pp x ``virtual`` stages of contiguous blocks, stage s on PP rank
    ``place[s]`` (default s mod pp; the V-shaped schedules' V: ``reference.pipeline.placement``), the embedding in
    stage 0, the final norm and the head in the last."""
    num_stages = dims.pp * virtual
    place = place or tuple(s % dims.pp for s in range(num_stages))
    if num_stages > len(pieces.blocks):
        raise ValueError(f"pp x virtual stages = {num_stages} cannot exceed the number of layers "
                         f"({len(pieces.blocks)}).")
    bounds = stage_bounds(len(pieces.blocks), num_stages)
    last = num_stages - 1
    return {s: Stage(pieces.blocks[bounds[s]:bounds[s + 1]], pieces.embed if s == 0 else None,
                     pieces.ln_f if s == last else None, pieces.head if s == last else None,
                     drop_embed=pieces.drop_embed if s == 0 else None)
            for s in range(num_stages) if place[s] == coordinates(dims, rank).pp}


def data_parallel(local: nn.Module, optimizer: OptimizerSpec, zero_stage: int, dp_group,
                  reduce_dtype: torch.dtype | None = None, divisor: int | None = None, replicate=None):
    """(the DP synchroniser, the optimizer that steps) over ``local``: gradients averaged (ZeRO 0) or
    reduce-scattered into the rank's shard of a flat buffer with sharded optimizer state (ZeRO 1, 2:
    ``reference.zero``); a bfloat16 / float16 ``local`` with fp32 masters (``MixedPrecisionZero``, its DP
    reduction in ``reduce_dtype``, default fp32). ``divisor``: the sum over ``dp_group`` divided by it instead
    of the group's size (ZeRO 1, 2 and mixed precision; experts over their EDP group: ``reference.stack.compose``).
    ``replicate``: hybrid sharding's replica group (ZeRO 1, 2: ``dp_group`` is then the shard group, each reduced
    shard all-reduced across ``replicate``)."""
    dtype = next(local.parameters()).dtype
    if dtype not in LOW and reduce_dtype not in (None, dtype):
        raise ValueError(f"reduce_dtype applies to a bfloat16 or float16 model; this one is {dtype}.")
    if dtype in LOW:
        sync = MixedPrecisionZero(local, optimizer, zero_stage, dp_group, reduce_dtype=reduce_dtype or torch.float32,
                                  divisor=divisor, replicate=replicate)
        return sync, sync.optimizer
    if zero_stage == 0:
        if divisor is not None:
            raise ValueError("ZeRO 0 in full precision averages over its group; divide the gradients first.")
        return NaiveDataParallel(local, dp_group), optimizer.build_named(local.named_parameters(),
                                                                         tp_split_matrices(local))
    sync = ShardedOptimizer(local, optimizer, zero_stage, dp_group, divisor, replicate, tp_split_matrices(local))
    return sync, sync.optimizer


def shard_stages(model: GPT, dims: ParallelDims, rank: int, tp_group, virtual: int,
                 checkpointing: bool = False, cp_group=None, ep_group=None,
                 place: tuple[int, ...] | None = None) -> dict[int, Stage]:
    """This rank's stages {index: Stage}, built from ``model``'s weights (``model`` is not modified): the
    dimensions in torchtitan's order — tensor, context, activation checkpointing, the pipeline split (data /
    ZeRO applies to the stages: ``data_parallel``) — with one dropout key for every dropout of the stages."""
    dims.check(dims.world_size, model.heads, len(model.blocks))
    pieces = context_parallel(tensor_parallel(pieces_of(model), tp_group), cp_group)
    pieces = activation_checkpointing(expert_parallel(pieces, ep_group, cp_group), checkpointing)
    stages = pipeline_split(pieces, dims, rank, virtual, place)
    key = DropoutKey(model.dropout_key.seed)
    for stage in stages.values():
        for mod in stage.modules():
            if isinstance(mod, KeyedDropout):
                mod.key = key
    return stages
