"""3D parallelism: one model of the GPT or the Llama family (reference.models) trained over data x pipeline
x tensor parallel ranks.

``parallelize(model, dims, schedule, zero_stage, checkpointing, ...)`` makes one ordered pass over the
model's ``Pieces`` (embedding, blocks, final norm, head), one function per dimension, torchtitan's order:
1. ``tensor_parallel``: the vocabulary-parallel embedding and LM head with its cross-entropy; each block
   split as its family says (``reference.models.sharding.tp_block``, beside the family: attention heads
   and MLP split over the TP group, norms replicated, a Llama's KV heads split or replicated);
2. ``activation_checkpointing`` of every block (``reference.checkpoint``; recomputation reruns the
   block's TP collectives, in the same order on every TP rank);
3. ``pipeline_split``: pp * v stages of contiguous blocks (v = 2 for the interleaved schedule), stage s
   on PP rank s mod pp, the embedding in stage 0, the final norm and the head in the last, run by
   ``PipelineRuntime`` over the PP group;
4. ``data_parallel`` over the DP group: gradients averaged (ZeRO 0) or reduce-scattered into the rank's
   shard of a flat buffer with sharded optimizer state (ZeRO 1, 2: ``reference.zero``).
Context and expert parallelism take their places in this pass (after tensor) when they arrive; the groups
come from one ``topology.ParallelDims`` whose dimensions are named in ``topology.ORDER``.

The loss each replica back-propagates is its tokens' summed cross-entropy / its token count (microbatch
losses add up to the replica's mean); the DP average of the replicas' gradients is then the global
batch's mean-loss gradient — one device's.

Dropout (a GPT built with ``dropout`` > 0) is keyed (``reference.dropout``): the trainer sets the key's
step and, before each microbatch's forward or backward, its global sample indices — so every layout
draws one device's masks. A ``loss_scaler`` scales each microbatch loss, unscales the reduced gradients
and skips the step on every rank when any rank holds an inf or NaN.

Mixed precision: a GPT in bfloat16 or float16 trains as ``reference.mixed_precision.MixedPrecisionZero``
does over the DP group — low-precision parameters, activations (pipeline messages, TP partial sums) and
gradients, an fp32 master copy and fp32 optimizer state (ZeRO 1/2: this DP rank's shard of them), the DP
reduction in ``reduce_dtype`` — with the cross-entropy in fp32 (Megatron's default); the loss scaler's
check and the clipping norm read the fp32 masters' gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from reference.clipping import clip_grad_norm_
from reference.context_parallel.layout import positions as sequence_positions
from reference.dropout import DropoutKey, KeyedDropout
from reference.expert_parallel.stack import StackMoE
from reference.mixed_precision import DynamicLossScaler
from reference.mixed_precision.zero import LOW
from reference.models import GPT
from reference.models.moe import zero_missing_grads
from reference.pipeline.generators import GENERATORS, generate, placement, stages_per_rank
from reference.pipeline.runtime import PipelineRuntime
from reference.stack.dimensions import (
    Pieces,
    Stage,
    activation_checkpointing,
    data_parallel,
    pieces_of,
    pipeline_split,
    shard_stages,
    stage_bounds,
    tensor_parallel,
)
from reference.stack.reduction import DataPart, Reduction  # noqa: F401 - DataPart: the parts' type
from reference.stack.topology import ParallelDims, all_reduce_over, build_groups, coordinates
from reference.tensor_parallel.vocab import IGNORE_INDEX
from reference.zero import LRSchedule, OptimizerSpec, Scheduled, StepRecipe

__all__ = ["Parallel3D", "Pieces", "SCHEDULES", "Stage", "activation_checkpointing", "data_parallel", "parallelize",
           "pieces_of", "pipeline_split", "shard_stages", "stage_bounds", "tensor_parallel"]

SCHEDULES = tuple(GENERATORS)  # every schedule: the split backward's W and the V placement are the runtime's


class Parallel3D:
    """A GPT trained over ``dims``: ``step(tokens, targets)`` takes the global batch (every rank passes
    the same) and returns the global mean loss on every rank."""

    def __init__(self, model: GPT, dims: ParallelDims, groups: dict, schedule: str, zero_stage: int,
                 checkpointing: bool, optimizer: OptimizerSpec, microbatches: int,
                 loss_scaler: DynamicLossScaler | None = None, max_grad_norm: float | None = None,
                 norm_type: float = 2.0, accumulation: int = 1, reduce_dtype: torch.dtype | None = None,
                 lr_schedule: LRSchedule | None = None):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}.")
        if zero_stage not in (0, 1, 2):
            raise ValueError(f"zero_stage must be 0, 1 or 2 with pipeline parallelism; got {zero_stage!r}.")
        StepRecipe(accumulation, max_grad_norm, norm_type)  # the same checks, the same sentences
        self.dims, self.groups, self.zero_stage, self.spec = dims, groups, zero_stage, optimizer
        rank = dist.get_rank()
        self.coords = coordinates(dims, rank)
        virtual = stages_per_rank(schedule, 2)
        self.stages = shard_stages(model, dims, rank, groups["tp"], virtual, checkpointing, groups.get("cp"),
                                   groups.get("ep"), placement(schedule, dims.pp, virtual))
        self.schedule = generate(schedule, dims.pp, microbatches, virtual)
        self.block_bounds = stage_bounds(len(model.blocks), self.schedule.num_stages)
        self.hidden = model.embed.embedding_dim
        self.local = nn.ModuleList(self.stages.values())
        self.mixed = next(model.parameters()).dtype in LOW
        """Low-precision parameters with fp32 masters (``reference.mixed_precision``)."""
        self.moe = [m for m in self.local.modules() if isinstance(m, StackMoE)]
        """This rank's mixture-of-experts layers (the moe family): their balance loss's weight is set per step."""
        self.aux_coef = float(getattr(model, "aux_coef", 0.0))
        self.reduction = Reduction(self.local, optimizer, zero_stage, self.mixed, groups, dims.ep, reduce_dtype)
        """How the step's gradients become the update (ZeRO 0 / 1 / 2, mixed precision, the experts over their
        expert-data-parallel group): ``reference.stack.reduction``."""
        r = self.reduction
        self.dp_group, self.experts, self.parts = r.dp_group, r.experts, r.parts
        self.sync, self.optimizer, self.expert_sync = r.sync, r.optimizer, r.expert_sync
        self.loss_scaler, self.max_grad_norm, self.norm_type = loss_scaler, max_grad_norm, norm_type
        self.accumulation = accumulation
        self.lr = Scheduled(lr_schedule)
        """The learning-rate schedule: each applied update at its factor of the optimizer's lr (a skipped one does
        not advance it)."""
        self.last_grad_norm: float | None = None
        """The global gradient norm of the last step (before clipping), when clipping is on and the step
        was taken (None after a step the loss scaler skipped)."""
        self.zero_group = r.zero_group
        self.clip_groups = {**groups, "dp": self.dp_group if not zero_stage else self.zero_group}
        """The groups the norm's partial terms are reduced over (tp, pp, and dp — dp x cp under cp; ZeRO's shards over
        its shard group: under hybrid sharding each replica holds every shard, counted once)."""
        self.dropout_key = next((m.key for m in self.local.modules() if isinstance(m, KeyedDropout)), DropoutKey())
        self.steps_done = 0
        """Steps taken (skipped ones included): the data position and the dropout masks' step."""
        last = self.schedule.num_stages - 1
        self.tie_embeddings = bool(getattr(model, "tie_embeddings", False))
        self.tied = [] if not self.tie_embeddings else (
            ([self.stages[0].embed.weight] if 0 in self.stages else [])
            + ([self.stages[last].head.weight] if last in self.stages else []))
        """This rank's copies of the tied embedding / LM head weight (the same vocabulary rows)."""
        self._norm_args = self._norm_terms()

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The distinct optimizers that step this rank's parameters (one per data-parallel part, or one for all)."""
        return self.reduction.optimizers

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        dims, c = self.dims, self.coords
        if len(tokens) % dims.dp:  # never drop the remainder rows silently
            raise ValueError(f"the global batch's {len(tokens)} rows do not split evenly over dp = {dims.dp} "
                             "replicas; pass a multiple of dp.")
        per_replica = len(tokens) // dims.dp
        mine = slice(c.dp * per_replica, (c.dp + 1) * per_replica)
        # the loss is the mean over the global batch's counted targets (padding, IGNORE_INDEX, is not counted);
        # the gradients are averaged over dp x cp, so each rank divides its sum by 1 / (dp x cp) of that count
        # (a trainer given only its own rows all-reduces its count; every rank here holds the global batch)
        count = int((targets != IGNORE_INDEX).sum()) / (dims.dp * dims.cp)
        tokens, targets = tokens[mine], targets[mine]
        if dims.cp > 1:  # this rank's zigzag shard of the sequence (a length it cannot split: one sentence)
            idx = sequence_positions(tokens.shape[1], dims.cp, c.cp, "zigzag", tokens.device)
            tokens, targets = tokens[:, idx], targets[:, idx]
        last = max(self.stages) == self.schedule.num_stages - 1
        head = self.stages[max(self.stages)].head if last else None
        scale = self.loss_scaler.scale if self.loss_scaler is not None else 1.0
        k = self.accumulation
        if per_replica % k:
            raise ValueError(f"a replica's {per_replica} rows cannot be split into {k} accumulation steps.")
        rows = per_replica // k
        self.dropout_key.step, self.last_grad_norm = self.steps_done, None

        def loss_fn(hidden, target):  # every micro-step divides by the rank's share of the counted targets
            return self.normalise(head(hidden, target).sum(), target, count) * scale  # scale: a power of two

        for p in self.local.parameters():
            p.grad = None
        for moe in self.moe:  # the balance loss's gradient weight (``reference.expert_parallel.stack``)
            moe.aux_weight, moe.sink = self.aux_coef * dims.cp * scale / per_replica, []
        loss = None
        for a in range(k):  # gradient accumulation: k pipeline passes, one reduction after the last
            part = slice(a * rows, (a + 1) * rows)
            first = mine.start + a * rows
            samples = torch.arange(first, first + rows).tensor_split(self.schedule.num_microbatches)

            def on_compute(stage, microbatch, samples=samples):  # dropout keyed by the global samples
                self.dropout_key.samples = samples[microbatch]

            runtime = PipelineRuntime(self.schedule, self.stages, loss_fn, rows, (tokens.shape[1], self.hidden),
                                      self.groups["pp"], on_compute)
            got = runtime.step(tokens[part] if 0 in self.stages else None, targets[part] if last else None)
            if got is not None:  # the last stage's rank: the pass's summed loss
                loss = got if loss is None else loss + got
        loss = loss / scale if loss is not None else None
        self.last_events = runtime.events  # (action, start, end) seconds of this rank's last pipeline pass
        self.steps_done += 1
        self._sum_tied()
        if self.moe and not self.mixed:  # an expert no token of this rank's reached has no gradient: zeros, as
            zero_missing_grads(self.local.parameters())  # every peer reduces it
        if self._may_step(self.reduction.reduce(scale)):
            if self.max_grad_norm is not None:
                params, kwargs = self._norm_args
                norm = clip_grad_norm_(params, self.max_grad_norm, self.clip_groups, self.norm_type, **kwargs)
                self.last_grad_norm = float(norm)
            self.lr.before_update(self.optimizers)
            self.reduction.update()
            self.lr.after_update()
        return self._global_loss(loss, len(tokens))

    def _global_loss(self, loss: torch.Tensor | None, rows: int) -> float:
        """The step's loss on every rank: the last stage's replica losses (each cp rank's: its shard's mean), summed,
        then averaged over dp x cp; plus the balance losses summed over every layer and sequence (on cp / tp rank
        0: the other ranks of a sequence hold the same values), averaged over the batch's sequences."""
        dims, c = self.dims, self.coords
        device = next(self.local.parameters()).device
        aux = float(sum(float(v) for m in self.moe for v in m.sink)) if c.tp == 0 and c.cp == 0 else 0.0
        value = torch.tensor([float(loss) if loss is not None and c.tp == 0 else 0.0] + ([aux] if self.moe else []),
                             dtype=torch.float64, device=device)
        all_reduce_over(value, self.groups, kinds=("pp", "tp", "dp", "cp"))
        balance = self.aux_coef * float(value[1]) / rows / dims.dp if self.moe else 0.0
        return float(value[0]) / (dims.dp * dims.cp) + balance

    @staticmethod
    def normalise(summed: torch.Tensor, target: torch.Tensor, share: float) -> torch.Tensor:
        """A micro-batch's loss from its summed cross-entropy: / this rank's share of the global batch's counted
        targets — not the micro-batch's own count (a mean per micro-batch, then averaged, weighs a short micro-
        batch's tokens up and gives 0 / 0 for one with none), nor the rank's own."""
        return summed / share

    def _sum_tied(self) -> None:
        """Tied embedding and head: each copy's gradient becomes the sum of both (Megatron's embedding-group
        all-reduce between the first and the last pipeline rank; a local sum when one rank holds both),
        so the copies, equal at the start, stay equal — one device's single parameter."""
        if not self.tied:
            return
        total = self.tied[0].grad.clone() if len(self.tied) == 1 else self.tied[0].grad + self.tied[1].grad
        # both copies here (one pipeline rank, or the V placement's rank 0, the embedding group's other rank then
        # holding neither): the sum is local, and no rank of the group enters the all-reduce
        if len(self.tied) == 1 and dist.get_world_size(self.groups["embed"]) > 1:
            dist.all_reduce(total, group=self.groups["embed"])
        for p in self.tied:
            p.grad = total.clone()

    def _norm_terms(self) -> tuple[list, dict]:
        """What ``clip_grad_norm_`` needs (``Reduction.norm_terms``): a tied head is the embedding's copy, counted
        once, there."""
        last = self.schedule.num_stages - 1
        copy_ = {id(self.stages[last].head.weight)} if self.tied and last in self.stages else set()
        return self.reduction.norm_terms(copy_)

    def _may_step(self, grads: list[torch.Tensor]) -> bool:
        """Ask the loss scaler about the unscaled gradients, with an inf or NaN on any rank seen by every
        rank (a max over the tp, pp and dp groups), so that all skip the step together."""
        return self.loss_scaler is None or self.loss_scaler.update_from(grads, self.clip_groups)


def parallelize(model: GPT, dims: ParallelDims, schedule: str = "1f1b", zero_stage: int = 0,
                checkpointing: bool = False, *, groups: dict | None = None,
                optimizer: OptimizerSpec | None = None, microbatches: int | None = None,
                loss_scaler: DynamicLossScaler | None = None, max_grad_norm: float | None = None,
                norm_type: float = 2.0, accumulation: int = 1, reduce_dtype: torch.dtype | None = None,
                lr_schedule: LRSchedule | None = None) -> Parallel3D:
    """``model`` over ``dims`` (TP, then checkpointing, then the pipeline split, then DP / ZeRO), trained
    with ``optimizer`` (default SGD, lr 0.05, momentum 0.9) on ``microbatches`` per step (default 2 pp),
    with ``loss_scaler`` (``reference.mixed_precision``) scaling the loss and skipping non-finite steps, and
    the gradients clipped to a global ``norm_type`` norm of ``max_grad_norm`` (``reference.clipping``), and
    ``accumulation`` pipeline passes (each of ``microbatches``) per optimizer step; a bfloat16 / float16
    ``model`` trains in mixed precision (fp32 masters), its DP gradients reduced in ``reduce_dtype`` (default
    fp32; a float32 / float64 model takes none); each applied update at ``lr_schedule``'s learning rate
    (``reference.zero.lr_schedule``; None: the optimizer's).
    ``groups`` (from ``topology.build_groups``) is created here when not given — collectively."""
    dims.check(dist.get_world_size(), model.heads, len(model.blocks))
    groups = groups if groups is not None else build_groups(dims, dist.get_rank())
    return Parallel3D(model, dims, groups, schedule, zero_stage, checkpointing,
                      optimizer or OptimizerSpec("sgd", 0.05), microbatches or 2 * dims.pp, loss_scaler,
                      max_grad_norm, norm_type, accumulation, reduce_dtype, lr_schedule)
