"""The torchtitan-style torch stack for the 3D comparison: the same GPT (reference.models) with DTensor
tensor parallelism (ColwiseParallel / RowwiseParallel per block, RowwiseParallel embedding, a
vocabulary-sharded head under ``loss_parallel``), torch.distributed.pipelining (a PipelineStage per stage a rank holds
— one, or two under the interleaved and V-shaped schedules — and torch's schedule class), and FSDP2 ``fully_shard``
over the DP mesh dimension (each stage its own root) — applied in torchtitan's
order (TP, then the pipeline split, then FSDP) on one ``init_device_mesh`` (dp, pp, tp), TP innermost.
With ``max_grad_norm`` set, the gradients are clipped as torchtitan's ``dist_utils.clip_grad_norm_`` does:
``torch.nn.utils.get_total_norm`` over the stage's (DTensor) gradients, ``full_tensor()``, the PP
reduction (sum of norm^p, or max) over the PP group, ``clip_grads_with_norm_``.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.runtime.rank import rank_device, summed
from harness.stack.inputs import token_share
from reference.stack.compose import Stage

# torch's class per schedule (the pipeline suite's): GPipe and 1F1B (SINGLE) take one stage, the rest a list of the
# rank's stages — ZB-H1 one, the interleaved and V-shaped ones two
from .pipeline import SCHEDULES, SINGLE


def lacks(schedule: str) -> str | None:
    """Why this torch cannot run ``schedule`` (its pipelining lacks the class: DualPipeV before 2.9), or None."""
    from torch.distributed import pipelining

    if hasattr(pipelining, SCHEDULES[schedule]):
        return None
    return f"this torch's pipelining has no {SCHEDULES[schedule]} (the {schedule} schedule)."


class Torch3D:
    """``step(tokens, targets)`` on the global batch; ``full_params()`` {name: full tensor} of this rank's
    stage, named as in the dense model."""

    tie_after_fsdp = False
    """A tied embedding re-tied after ``fully_shard`` (torchtitan's order: ``init_weights`` after parallelize) — FSDP2
    then holds two parameters where the module shares one. A planted bug's knob (``suites.stack.planted``)."""

    sequence_parallel_norms = True
    """Under sequence parallelism, the norms ``SequenceParallel`` (their weights' gradients, partial per share of
    the sequence, summed over the TP group by DTensor). False: the norms left out of the plan — each TP rank's norm
    steps with its own share's gradient (Megatron's norms without their TP all-reduce). A planted bug's knob."""

    loss_over_global_count = False
    """Each replica's summed loss divided by the global batch's count of targets, where DDP / FSDP2 average the
    replicas' gradients as well: every gradient / dp (torchtitan 0.2's DDP finding, as a user writes it). A planted
    bug's knob."""

    def __init__(self, model, dp: int, pp: int, tp: int, schedule: str, microbatches: int, lr: float,
                 mesh=None, optimizer=None, reshard_after_forward: bool = True, accumulation: int = 1,
                 checkpointing: str | None = None, compile: bool = False, tensor_parallel: bool = True,
                 offload: bool = False, lr_schedule=None, sequence_parallel: bool = False, ddp: int | None = None):
        """``lr_schedule`` (``reference.zero.LRSchedule``): torch's ``LambdaLR`` over the optimizer with its factor,
        stepped after each update, as a torch user writes it.
        ``tensor_parallel`` False (tp 1 only): the blocks, embedding and head left plain tensors, not DTensors on
        the one-rank TP mesh — what FSDP2's partial resharding (``reshard_after_forward`` an int) takes. ``offload``:
        FSDP2's ``CPUOffloadPolicy`` (the sharded parameters, their gradients and the optimizer's step on the host;
        pinned where the machine pins). ``sequence_parallel``: torchtitan's plan with sequence parallelism (each norm
        ``SequenceParallel`` on the rank's share of the sequence, the attention's and the MLP's input gathered, their
        row-wise output reduce-scattered back to it; ``_tp_plan``). ``ddp`` (tp 1, one replica group): the stage in
        torch's ``DistributedDataParallel`` over dp instead of FSDP2 — ZeRO 0, or with 1 ``ZeroRedundancyOptimizer``
        (each parameter's optimizer state on one rank, its update broadcast); pipelining's stage runs the
        micro-batches but the last under DDP's ``no_sync`` (``PipelineStage.backward_maybe_with_nosync``), and so
        does every accumulation pass but the last (``step``)."""
        from torch.distributed import pipelining
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        from reference.pipeline.generators import placement, stages_per_rank
        from reference.stack.dimensions import stage_bounds

        if schedule not in SCHEDULES:
            raise NotImplementedError(f"the torch 3D stack runs torch's {', '.join(SCHEDULES)} schedules here, not "
                                      f"{schedule!r}.")
        if (why := lacks(schedule)) is not None:
            raise NotImplementedError(why)
        virtual = stages_per_rank(schedule, 2)
        num_stages = pp * virtual
        tied = getattr(model, "tie_embeddings", False)
        if tied and num_stages > 1 and not getattr(self, "split_tied", False):
            # PipelineStage holds a stage's own modules: nothing sums a parameter shared by two stages (torchtitan
            # refuses weight tying under pp too); split as is, the copies drift apart
            raise NotImplementedError("the torch 3D stack cannot tie the embedding to the LM head: "
                                      "torch.distributed.pipelining has no parameter shared across stages.")
        mesh = mesh or init_device_mesh(rank_device().type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
        self.dims, self.mesh, self.microbatches, self.accumulation = (dp, pp, tp), mesh, microbatches, accumulation
        hybrid = "dp_replicate" in (mesh.mesh_dim_names or ())
        """HSDP: a (dp_replicate, dp_shard, pp, tp) mesh — FSDP2 over its 2-D data-parallel sub-mesh."""
        dp_mesh = mesh["dp_replicate", "dp_shard"] if hybrid else mesh["dp"]
        self.dp_rank = (mesh.get_local_rank("dp_replicate") * mesh["dp_shard"].size() + mesh.get_local_rank("dp_shard")
                        if hybrid else mesh.get_local_rank("dp"))
        pp_rank = mesh.get_local_rank("pp")
        self.indices = [s for s, r in enumerate(placement(schedule, pp, virtual)) if r == pp_rank]
        """The pipeline stages this rank holds (one; two under the interleaved and V-shaped schedules)."""
        bounds = stage_bounds(len(model.blocks), num_stages)  # contiguous blocks, earlier stages the extra one
        if not tensor_parallel and (tp > 1 or sequence_parallel):
            raise ValueError(f"tp = {tp} splits the layers (and sequence parallelism their activations): they are "
                             "tensor-parallel.")
        self.sequence_parallel = sequence_parallel
        between = Shard(1) if sequence_parallel else Replicate()  # the activations between the blocks: the rank's
        # share of the sequence (batch-first), or whole
        self.first, self.last = 0 in self.indices, num_stages - 1 in self.indices
        stages, dense_names = [], []
        for s in self.indices:
            stages.append(self._split(model, s, num_stages, bounds))
            dense_names.append({name: _dense_name(name, bounds[s]) for name, _ in stages[-1].named_parameters()})
        stage = stages[0] if len(stages) == 1 else torch.nn.ModuleList(stages)
        """This rank's model: its one stage, or its stages as one module (named "0.…", "1.…")."""
        self.names = {f"{i}.{n}" if len(stages) > 1 else n: d for i, names in enumerate(dense_names)
                      for n, d in names.items()}
        """{this rank's parameter name (``stage.named_parameters()``): its name in the dense model}"""
        tp_mesh = mesh["tp"]
        policy = {}
        low = next(stage.parameters()).dtype
        if low in (torch.bfloat16, torch.float16):  # FSDP2's mixed precision: fp32 parameters (the masters), each
            # module computing in a low-precision copy, gradients reduced in fp32 — torchtitan's recipe
            from torch.distributed.fsdp import MixedPrecisionPolicy

            stage.float()
            policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        if offload:
            from torch.distributed.fsdp import CPUOffloadPolicy

            from harness.runtime.capabilities import pinned_memory_unsupported

            policy["offload_policy"] = CPUOffloadPolicy(pin_memory=pinned_memory_unsupported() is None)
        if ddp is not None and (tp > 1 or hybrid or policy):
            raise ValueError("the torch stack's DDP runs at tp 1 over one replica group, without FSDP2's mixed "
                             "precision or offload.")
        self.ddp, self.submods, self.pstages = ddp, [], []
        """``submods``: each stage as pipelining runs it (in DDP, or the FSDP2 module itself); ``pstages`` their
        ``PipelineStage``s, in the order of ``indices``."""
        for s, one in zip(self.indices, stages, strict=True):
            for block in one.blocks if tensor_parallel else ():
                parallelize_module(block, tp_mesh, _tp_plan(block, sequence_parallel, self.sequence_parallel_norms))
                block.attn.heads //= tp
                if hasattr(block.attn, "kv_heads"):  # a Llama block: KV heads split like the query heads
                    block.attn.kv_heads //= tp
            if one.embed is not None and tensor_parallel:
                parallelize_module(one.embed, tp_mesh, RowwiseParallel(input_layouts=Replicate(),
                                                                       output_layouts=between))
            if one.head is not None and tensor_parallel:
                if sequence_parallel and self.sequence_parallel_norms:
                    parallelize_module(one.ln_f, tp_mesh, SequenceParallel())
                parallelize_module(one.head, tp_mesh, ColwiseParallel(input_layouts=between, output_layouts=Shard(-1),
                                                                      use_local_output=False))
            tie = tied and one.embed is not None and one.head is not None
            if tie and not self.tie_after_fsdp:  # one stage: one parameter for both uses, tied before FSDP2 groups
                # it (its FSDPParam then serves both modules); each deepcopy and each parallelize_module made its
                # own parameter — the embedding's and the head's placements agree (Shard(0): the vocabulary's rows)
                one.head.weight = one.embed.weight
            for block in one.blocks:  # torchtitan's order: TP, activation checkpointing, compile, FSDP
                _wrap_forward(block, checkpointing, compile)
                if sequence_parallel and hasattr(block, "mlp"):  # a Llama block's rotary positions: the whole
                    _whole_positions(block)  # sequence's (it is given the rank's share)
            submod = one
            if ddp is not None:  # DDP over dp: the parameters whole on every replica, the gradients all-reduced
                from torch.nn.parallel import DistributedDataParallel

                submod = DistributedDataParallel(one, process_group=dp_mesh.get_group(), gradient_as_bucket_view=True)
            else:  # each stage its own FSDP2 root (torchtitan's model parts)
                for block in one.blocks:
                    fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, **policy)
                fully_shard(one, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, **policy)
            if tie and self.tie_after_fsdp:
                one.embed.weight = one.head.weight
            self.submods.append(submod)
            self.pstages.append(pipelining.PipelineStage(submod, s, num_stages, rank_device(),
                                                         group=mesh["pp"].get_group()))
        self.stage = stage
        self.optimizer = self._optimizer(optimizer, lr, dp_mesh)
        self.lr_schedule = lr_schedule
        self.schedulers = self.scheduled()
        """One ``LambdaLR`` per torch optimizer (Muon's matrices and its AdamW: two, as a torch user runs them); none
        without a schedule."""
        self.schedule, self.schedule_cls = schedule, getattr(pipelining, SCHEDULES[schedule])
        self._schedule, self._count = None, 1
        self.max_grad_norm, self.norm_type, self.last_grad_norm = None, 2.0, None
        self.scaler = None
        """float16: ``torch.amp.GradScaler`` (set by the stack): the loss scaled in ``loss_fn``, the gradients unscaled
        before clipping, the step skipped on an inf, the schedulers held still on a skipped step."""
        self.clip_recipe = "per-mesh"
        """"torchtitan": its clip_grad_norm_ verbatim (one get_total_norm over every gradient); "per-mesh":
        one get_total_norm per device mesh, combined (sum of norm^p, or max) — this stack's LayerNorms are
        FSDP-sharded only (mesh dp) while the TP layers are on (dp, tp), which the verbatim recipe
        cannot mix."""

    def _split(self, model, s: int, num_stages: int, bounds: list) -> Stage:
        """Stage ``s`` of ``num_stages`` of the one-device ``model``: copies of its blocks, and of the embedding (the
        first) or the final norm and the head (the last)."""
        first, last = s == 0, s == num_stages - 1
        return Stage([copy.deepcopy(model.blocks[i]) for i in range(bounds[s], bounds[s + 1])],
                     copy.deepcopy(model.embed) if first else None, copy.deepcopy(model.ln_f) if last else None,
                     copy.deepcopy(model.head) if last else None, apply_head=True)

    def _optimizer(self, spec, lr: float, dp_mesh):
        """By the dense model's names: Muon's rule (``OptimizerSpec.build_named``) — torch's Muon on the DTensors; at
        ``ddp`` 1 ``ZeroRedundancyOptimizer`` over dp with the spec's torch class (AdamW's rule as its groups)."""
        stage = self.stage
        if spec is None:
            return torch.optim.SGD(stage.parameters(), lr=lr, momentum=0.9)
        if self.ddp == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            cls, kwargs = spec.torch_class()  # Muon: ValueError (refused before: ``harness.adapters.torch.stack``)
            return ZeroRedundancyOptimizer(spec.param_groups(stage.parameters()), optimizer_class=cls,
                                           process_group=dp_mesh.get_group(), **kwargs)
        return spec.build_named((self.names[n], p) for n, p in stage.named_parameters())

    @property
    def state(self) -> dict:
        """The optimizer state this rank holds, by parameter (``ZeroRedundancyOptimizer``: its own parameters')."""
        return self.optimizer.optim.state if self.ddp == 1 else self.optimizer.state

    def scheduled(self, position: int = 0) -> list:
        """The schedulers at ``position`` (updates taken): torch's constructor steps to it and sets each group's lr."""
        if self.lr_schedule is None:
            return []
        optimizers = getattr(self.optimizer, "optimizers", [self.optimizer])  # MuonAdamW: its two torch optimizers
        return [torch.optim.lr_scheduler.LambdaLR(opt, self.lr_schedule.factor, last_epoch=position - 1)
                for opt in optimizers]

    def step(self, tokens, targets) -> float:
        from torch.distributed.tensor.parallel import loss_parallel

        dp, k, tp = self.dims[0], self.accumulation, self.dims[2]
        if len(tokens) % dp or len(tokens) // dp % k:
            raise ValueError(f"the global batch's {len(tokens)} rows do not split evenly over dp = {dp} replicas and "
                             f"{k} accumulation passes.")
        if self.sequence_parallel and tokens.shape[1] % tp:  # the plan's local shards are read as even ones
            # (DTensor.from_local): uneven, the ranks disagree on the gathered shape (6 tokens over tp 4: a deadlock)
            raise ValueError(f"the sequence's {tokens.shape[1]} tokens do not split evenly over tp = {tp} ranks "
                             "(sequence parallelism shards them).")
        per = len(tokens) // dp
        mine = slice(self.dp_rank * per, (self.dp_rank + 1) * per)
        # each replica's share of the global batch's counted targets (the planted knob: all of them)
        self._count = token_share(targets, 1 if self.loss_over_global_count else dp)
        tokens, targets = tokens[mine], targets[mine]
        if self._schedule is None:  # one schedule for every pass: a new one re-runs the stage's shape
            # inference, whose clean-up drops the gradients accumulated so far (PipelineStage)

            def loss_fn(logits, target):  # each pass divides by the replica's share (FSDP averages over dp)
                if logits.dtype in (torch.bfloat16, torch.float16):  # the cross-entropy in fp32: torchtitan's .float()
                    logits = logits.float()
                loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum") / self._count
                return loss if self.scaler is None else self.scaler.scale(loss)  # fp16: scaled as a torch user scales

            stages = self.pstages[0] if self.schedule in SINGLE else self.pstages
            self._schedule = self.schedule_cls(stages, self.microbatches, loss_fn=loss_fn, scale_grads=False)
        self.optimizer.zero_grad()
        losses: list = []
        scale = 1.0 if self.scaler is None else float(self.scaler.get_scale())
        rows = per // k
        for a in range(k):  # gradient accumulation: FSDP2 sums each pass's reduced gradient into its shard; DDP
            # reduces at the last pass only (each earlier one under no_sync, as a DDP user accumulates)
            part = slice(a * rows, (a + 1) * rows)
            passed: list = []  # schedule.step clears the list it is given
            with loss_parallel(), contextlib.ExitStack() as quiet:
                if self.ddp is not None and a < k - 1:
                    for submod in self.submods:
                        quiet.enter_context(submod.no_sync())
                kwargs = {"target": targets[part], "losses": passed} if self.last else {}
                self._schedule.step(*((tokens[part],) if self.first else ()), **kwargs)
            losses += passed
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # before clipping, as torch's AMP recipe says
        if self.max_grad_norm is not None:
            self.last_grad_norm = self._clip()
        applied = True
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)  # skipped where an inf was found
            self.scaler.update()
            applied = float(self.scaler.get_scale()) >= scale  # an inf backs the scale off; a clean step never
        for scheduler in self.schedulers if applied else ():  # a skipped update does not advance the schedule
            scheduler.step()
        # the last stage's replicas, times tp ranks each
        [value] = summed([float(sum(_full(loss).item() for loss in losses)) / scale if self.last else 0.0])
        return value / (dp * self.dims[2])

    def _clip(self) -> float:
        """torchtitan's clip_grad_norm_ (non-EP path) — verbatim, or per device mesh (``clip_recipe``)."""
        import math

        params = [p for p in self.stage.parameters() if p.grad is not None]
        groups: dict = {}  # the parameters per device mesh of their gradients (a plain tensor: None), keyed by
        # the mesh's value: id() of a mesh object is not stable (a freed one's id is reused), and a group of
        # only empty FSDP shards would make the inf-norm raise on that rank
        for p in params:
            mesh = getattr(p.grad, "device_mesh", None)
            key = None if mesh is None else (tuple(mesh.mesh_dim_names or ()), tuple(mesh.mesh.flatten().tolist()))
            groups.setdefault(key, []).append(p)
        if self.clip_recipe == "torchtitan":
            groups = {0: params}
        norms = torch.stack([_full(torch.nn.utils.get_total_norm([p.grad for p in g], self.norm_type))
                             for g in groups.values()])
        p_ = self.norm_type
        total = norms.max() if math.isinf(p_) else (norms ** p_).sum() ** (1 / p_)
        if self.dims[1] > 1:
            group = self.mesh["pp"].get_group()
            if math.isinf(p_):
                dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
            else:
                total **= p_
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
                total **= 1.0 / p_
        for g in groups.values():
            torch.nn.utils.clip_grads_with_norm_(g, self.max_grad_norm, total)
        return float(total)

    def full_params(self) -> dict:
        from harness.stack.dense import full_tensors, on_their_devices

        named = {self.names[name]: p.detach() for name, p in self.stage.named_parameters()}
        return on_their_devices(full_tensors(named), named)


def _dense_name(name: str, lo: int) -> str:
    """A stage's parameter name in the dense model: its blocks counted from ``lo``."""
    parts = name.split(".")
    return f"blocks.{lo + int(parts[1])}.{'.'.join(parts[2:])}" if parts[0] == "blocks" else name


def _wrap_forward(block, checkpointing: str | None, compiled: bool) -> None:
    """``block``'s forward checkpointed ("full", or "selective": the matmuls saved) and / or compiled, in place — its
    parameters' names unchanged, FSDP2's hooks (registered on the module) outside the checkpoint and the compiled
    region."""
    forward = block.forward
    if checkpointing is not None:
        from torch.utils.checkpoint import checkpoint

        from .checkpoint import selective_context

        extra = {"context_fn": selective_context()} if checkpointing == "selective" else {}

        def forward(*args, _inner=block.forward, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)
    if compiled:
        from harness.stack.compiled_ops import backend

        forward = torch.compile(forward, backend=backend())  # inductor (a recorder while recompute is counted)
    block.forward = forward


def _tp_plan(block, sequence_parallel: bool = False, norms: bool = True) -> dict:
    """torchtitan's plan per family: q, k, v (and GPT's fc1 / Llama's gate, up) column-wise, the output
    projection (and fc2 / down) row-wise. With ``sequence_parallel`` (torchtitan's ``apply_tp``): each norm
    ``SequenceParallel`` (its input the rank's share of the sequence, dim 1), the attention's input gathered
    (``PrepareModuleInput``: the GPT's attention is sequence-first, dim 0) and so the Llama's MLP's (the GPT's
    fc1 gathers its own), each row-wise output reduce-scattered back to the rank's share. ``norms`` False: the norms
    left out (``Torch3D.sequence_parallel_norms``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    sp = sequence_parallel
    llama = hasattr(block, "mlp")  # SwiGLU; the GPT's fc1 / fc2 sit on the block
    seq = Shard(1) if sp else Replicate()  # the block's activations (batch-first)
    attn_seq = (Shard(1) if llama else Shard(0)) if sp else Replicate()  # the attention's (the GPT's: sequence-first)
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=attn_seq)}
    if sp:
        if norms:
            plan.update({norm: SequenceParallel() for norm in (("attn_norm", "mlp_norm") if llama else ("ln1", "ln2"))})
        plan["attn"] = PrepareModuleInput(input_layouts=(attn_seq, None) if llama else (attn_seq,),
                                          desired_input_layouts=(Replicate(), None) if llama else (Replicate(),))
    if llama:
        if sp:
            plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        return {**plan, "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
                "mlp.down": RowwiseParallel(output_layouts=seq)}
    return {**plan, "fc1": ColwiseParallel(input_layouts=seq), "fc2": RowwiseParallel(output_layouts=seq)}


def _whole_positions(block) -> None:
    """A Llama block's attention rotating at the positions of what it is given — the gathered sequence — not at the
    block's (computed from the rank's share of it, which the block is given)."""
    forward = block.attn.forward

    def whole(x, positions=None):
        return forward(x, torch.arange(x.shape[1], device=x.device))

    block.attn.forward = whole


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t
