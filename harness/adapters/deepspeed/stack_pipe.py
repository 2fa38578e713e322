"""DeepSpeed's pipeline engine under the stack contract: the one-device model written as DeepSpeed's layer list
(``PipelineModule``: the embedding, every block, the final norm, the LM head; a tied head is a
``TiedLayerSpec`` of the embedding, DeepSpeed's own tied-weight path), partitioned by DeepSpeed
(``partition_method="parameters"``, its default) over pp stages, trained by ``PipelineEngine.train_batch`` — its
1F1B ``TrainSchedule`` over ``gradient_accumulation_steps`` micro-batches, its data-parallel gradient average, its
tied-gradient all-reduce, its ZeRO 0 / 1 (it asserts ZeRO 2 and 3 are incompatible with pipelining), its
gradient clipping, its activation checkpointing (``activation_checkpoint_interval`` 1 over every block).

The ranks are DeepSpeed's ``PipeDataParallelTopology`` (pipe outermost, data innermost; this rank's replica is
``grid.get_data_parallel_rank()``). The contract's accumulation (k pipeline passes of m micro-batches per step) is
DeepSpeed's one ``train_batch`` of m x k micro-batches: the same gradient sum, the same loss mean (each micro-
batch's summed loss divided by its share of the global batch's counted targets, ``SharedTokenLoss``: the mean
over every counted target, padding or not).

bf16: DeepSpeed's own recipe (``"bf16": {"enabled": true}``: it rounds the model, its BF16_Optimizer keeps fp32
masters and state). Full state on every rank: each stage's parameters by identity with the one-device model's
(DeepSpeed keeps the modules it is given), bf16's masters through ``safe_get_full_fp32_param``, their optimizer
state through ``safe_get_full_optimizer_state`` (ZeRO 1, bf16) or the client optimizer (ZeRO 0 fp32), gathered
over the world."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from harness.adapters.deepspeed.resume import DeepSpeedCheckpoint
from harness.stack.built import BuiltFromDense
from harness.stack.inputs import SharedTokenLoss


class _Piece(nn.Module):
    """A module of the one-device model (the module itself, not a copy) as a pipeline layer: the embedding, the
    final norm, the LM head."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def _tied_head(piece: _Piece, x):
    """The tied LM head: the embedding's weight as the output projection (the one-device model's head has no bias)."""
    return torch.nn.functional.linear(x, piece.module.weight)


def pipeline_module(model, stages: int, checkpointing: bool):
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    if model.tie_embeddings:
        first = TiedLayerSpec("embed", _Piece, model.embed, tied_weight_attr=["module.weight"])
        last = TiedLayerSpec("embed", _Piece, model.embed, forward_fn=_tied_head, tied_weight_attr=["module.weight"])
    else:
        first, last = LayerSpec(_Piece, model.embed), LayerSpec(_Piece, model.head)
    layers = [first, *model.blocks, LayerSpec(_Piece, model.ln_f), last]
    blocks = sorted({type(b).__name__ for b in model.blocks})
    # train_batch averages its micro-batches' losses: each divides its sum by its share of the counted targets
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=SharedTokenLoss(), partition_method="parameters",
                          activation_checkpoint_interval=int(checkpointing), checkpointable_layers=blocks)


class PipeState:
    """The engine's full state, on every rank: this stage's parameters by identity, gathered over the world."""

    def __init__(self, engine, optimizer, spec, stage, model):
        self.engine, self.optimizer, self.spec, self.stage = engine, optimizer, spec, stage
        self.mixed = next(engine.module.parameters()).dtype == torch.bfloat16
        self.names = {id(p): name for name, p in model.named_parameters()}  # a tied weight: its first name

    def _local(self):
        seen, out = set(), []
        for p in self.engine.module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((self.names[id(p)], p))
        return out

    def _gathered(self, local: dict) -> dict:
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local)
        return {k: v for part in parts for k, v in part.items()}

    def full_params(self) -> dict:
        """The fp32 parameters — bf16: the masters of DeepSpeed's BF16_Optimizer (``safe_get_full_fp32_param``)."""
        from deepspeed.utils import safe_get_full_fp32_param

        return self._gathered({name: (safe_get_full_fp32_param(p) if self.mixed else p).detach().cpu().clone()
                               for name, p in self._local()})

    def full_optimizer_state(self) -> dict:
        from deepspeed.utils import safe_get_full_optimizer_state

        from .moe_stack import relink_groups

        # ZeRO 1 with two groups (AdamW's spared vectors): DeepSpeed links the first group's state only (a finding)
        relink_groups(self.optimizer, self.stage)
        local = {}
        for name, p in self._local():
            if self.stage == 0 and not self.mixed:
                local[name] = {k: self.optimizer.state[p][k].cpu().clone() for k in self.spec.state_keys}
            else:  # collective over this stage's data-parallel group (every replica holds the same parameters)
                local[name] = {k: safe_get_full_optimizer_state(p, k).cpu() for k in self.spec.state_keys}
        return self._gathered(local)


def train_step(engine, tokens, targets, micro_batches: int) -> float:
    """One ``train_batch`` over this replica's rows in ``micro_batches`` micro-batches; the loss DeepSpeed
    returns (the mean over its micro-batches and replicas, on every stage)."""
    from harness.stack.inputs import replica_rows, token_share

    dp = engine.grid.get_data_parallel_world_size()
    mine, theirs, rows = replica_rows(tokens, targets, dp, engine.grid.get_data_parallel_rank(), micro_batches)
    engine.module.loss_fn.share = token_share(targets, dp * micro_batches)
    batches = iter([(mine[i * rows:(i + 1) * rows], theirs[i * rows:(i + 1) * rows]) for i in range(micro_batches)])
    return float(engine.train_batch(data_iter=batches))


class DeepSpeedPipeTrainer(DeepSpeedCheckpoint, BuiltFromDense):
    """``build``'s trainer where pp > 1 or checkpointing: ``load_dense`` / ``step`` / ``dense_state``, ``save`` /
    ``load``."""

    kind = "pipeline"

    def __init__(self, spec, layout, recipe, config=None):
        self.spec, self.layout, self.recipe, self.config = spec, layout, recipe, config or {}
        self.micro_batches = layout.num_microbatches * recipe.accumulation
        self.last_grad_norm = None

    def _build(self, model):
        from harness.adapters.deepspeed.init import init
        from harness.adapters.deepspeed.mixed import bf16_config
        from harness.adapters.deepspeed.zero import client_scheduler, engine_config, merged, require_offload

        init()
        import deepspeed

        recipe, layout = self.recipe, self.layout
        config = merged(engine_config(layout.zero, self.micro_batches, recipe.max_grad_norm), bf16_config(self.spec),
                        self.config)
        model = model.float()  # bf16: DeepSpeed rounds the model itself; its fp32 masters are the rounded weights
        module = pipeline_module(model, layout.pp, layout.checkpointing)
        client = recipe.optimizer.build([p for p in module.parameters()])
        engine, optimizer, _, _ = deepspeed.initialize(model=module, optimizer=client, config=config,
                                                       **client_scheduler(recipe.lr_schedule))
        require_offload(config, optimizer)  # where an option offloads
        self.state = PipeState(engine, client if layout.zero == 0 else optimizer, recipe.optimizer, layout.zero,
                               model)
        return engine

    @property
    def engine(self):
        return self.trainer

    def step(self, tokens, targets) -> float:
        loss = train_step(self.engine, tokens, targets, self.micro_batches)
        if self.recipe.max_grad_norm is not None:
            norm = self.engine.get_global_grad_norm()
            self.last_grad_norm = None if norm is None else float(norm)
        return loss

    def memory(self) -> dict:
        from harness.adapters.deepspeed.zero import engine_memory

        return engine_memory(self.engine)

    def dense_state(self) -> dict:
        params, optimizer = self.state.full_params(), self.state.full_optimizer_state()
        if self.spec.tie_embeddings:  # one parameter: both names, its state once
            params["head.weight"] = params["embed.weight"]
            optimizer.pop("head.weight", None)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
