"""Hugging Face accelerate under the stack contract, driven as its docs drive a training loop: an ``Accelerator``
(``DistributedDataParallel`` at ZeRO 0; its FSDP2 plugin at ZeRO 2 / 3 — ``reshard_after_forward`` False / True,
each block its own FSDP unit, the plugin's activation checkpointing), ``accelerator.prepare(model, optimizer)``,
a ``GradientAccumulationPlugin`` of the recipe's accumulation steps, ``with accelerator.accumulate(model):``
around each micro-step, ``accelerator.backward(loss)`` (it divides by the accumulation steps),
``accelerator.clip_grad_norm_`` on the step that syncs, the prepared optimizer's ``step`` / ``zero_grad``.

The loss: each micro-step's summed cross-entropy over its counted targets divided by its share of the global
batch's (``token_share`` over dp x accumulation) — accelerate's documented way for a padded batch
(``num_items_in_batch``): it averages micro-steps and replicas, so each divides by its share of the global
count. Full state on every rank: FSDP2's DTensors gathered (``full_tensor``) — ``accelerator.get_state_dict``
would give it on rank 0 only (``harness.stack.helpers.from_rank0`` where a stack has only that).

Process-global state: accelerate keeps its ``PartialState`` / ``AcceleratorState`` / ``GradientState`` as class-
level singletons and writes ``ACCELERATE_USE_FSDP`` into the environment when given an FSDP plugin; rank processes
are reused across cases, so ``build`` restores the environment the rank started with and resets the singletons
(``_reset_state``: accelerate's own test utilities' call, guarded in ``reset_accelerate``). The ranks' launcher
environment (``RANK``, ``WORLD_SIZE``, ...) is what ``PartialState`` reads; the default group is already
initialised, which it uses.

Not here: tensor and context parallelism (accelerate's come from a transformers model's ``tp_plan`` and
FSDP2's CUDA-only context manager), pipelines, ZeRO 1, mixed precision (its ``mixed_precision="bf16"`` is
autocast over fp32 weights, not the contract's bf16 model with fp32 masters), dropout (the one-device masks
are keyed by the global row and step, which the loop does not pass).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from harness.contracts import Unsupported
from harness.runtime.rank import summed
from harness.stack.built import BuiltFromDense
from harness.stack.dense import tied
from harness.stack.supports import Rule, Supports

_PREFIXES = ("ACCELERATE_", "FSDP_")
_START_ENV: dict[str, str] = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
"""accelerate's variables as the rank process started (imported there before any case's build)."""
RESET_FALLBACKS: list[str] = []
"""Why accelerate's singletons could not be reset (its private ``_reset_state`` gone): a case then runs on
whatever state an earlier case left, accelerate's own behaviour."""


SUPPORTS = Supports("the accelerate stack", unsupported=(
    Rule(lambda s, lay, r: r.low_precision is not None,
         "accelerate's mixed_precision='fp8' runs TransformerEngine, MS-AMP or torchao on an accelerator; on a CPU it "
         "is not driven here (torchao's float8 is the torch stack's)."),
    Rule(lambda s, lay, r: s.family not in ("gpt", "llama"),
         lambda s, lay, r: f"the accelerate stack trains the dense gpt and llama families, not {s.family}."),
    Rule(lambda s, lay, r: s.dtype not in ("float64", "float32"),
         lambda s, lay, r: "accelerate's mixed precision is autocast over fp32 weights (mixed_precision='bf16'), not "
                           f"the contract's {s.dtype} model with fp32 masters."),
    Rule(lambda s, lay, r: lay.pp > 1 or lay.tp > 1 or lay.cp > 1 or lay.ep > 1 or lay.sequence_parallel,
         "the accelerate stack here is data parallel (DDP, FSDP2): its tensor and context parallelism need a "
         "transformers model's tp_plan and CUDA; it has no pipeline."),
    Rule(lambda s, lay, r: lay.zero == 1 and lay.dp > 1,
         "accelerate shards with FSDP2 (ZeRO 2 / 3) or replicates with DDP (ZeRO 0); ZeRO 1 it does not do."),
    Rule(lambda s, lay, r: lay.checkpointing and lay.zero < 2,
         "accelerate's activation checkpointing is its FSDP plugin's (ZeRO 2 / 3 here)."),
    Rule(lambda s, lay, r: bool(s.dropout),
         "the accelerate stack trains without dropout: the one-device masks are keyed by each row's global index and "
         "the step, which its training loop does not pass."),
    Rule(lambda s, lay, r: r.loss_scale is not None,
         "the accelerate stack here has no loss scaler (float32 needs none)."),
), optimizers=("sgd", "adam", "adamw"), schedules=True)


def reset_accelerate() -> None:
    """The rank's environment as it started (accelerate's plugins write ``ACCELERATE_USE_*``), accelerate's
    singletons cleared — or, where its private ``_reset_state`` is gone, left as they are (said once)."""
    for key in [k for k in os.environ if k.startswith(_PREFIXES) and k not in _START_ENV]:
        del os.environ[key]
    os.environ.update(_START_ENV)
    from accelerate.state import AcceleratorState, GradientState

    resets = [getattr(AcceleratorState, "_reset_state", None), getattr(GradientState, "_reset_state", None)]
    if not all(callable(r) for r in resets):
        why = "accelerate has no AcceleratorState._reset_state / GradientState._reset_state: its state is kept"
        if why not in RESET_FALLBACKS:
            RESET_FALLBACKS.append(why)
            warnings.warn(why, stacklevel=2)
        return
    resets[0](True)
    resets[1]()


class AccelerateStack:
    description = "Hugging Face accelerate: Accelerator + DDP / FSDP2 plugin, accumulate, backward, clip_grad_norm_"

    def build(self, spec, layout, recipe, group=None):
        SUPPORTS.check(spec, layout, recipe)
        if group not in (None, dist.group.WORLD):
            raise Unsupported("accelerate's data-parallel group is the world here (no group argument).")
        return AccelerateTrainer(spec, layout, recipe)


class AccelerateTrainer(BuiltFromDense):
    def __init__(self, spec, layout, recipe):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, GradientAccumulationPlugin

        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.last_grad_norm = None
        reset_accelerate()
        fsdp = None
        if layout.zero >= 2 and layout.dp > 1:
            blocks = sorted({type(b).__name__ for b in spec.build(0).blocks})
            fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=layout.zero == 3,
                                                  auto_wrap_policy="transformer_based_wrap",
                                                  transformer_cls_names_to_wrap=blocks,
                                                  activation_checkpointing=layout.checkpointing,
                                                  state_dict_type="SHARDED_STATE_DICT")
        accumulation = GradientAccumulationPlugin(num_steps=recipe.accumulation, sync_with_dataloader=False)
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), fsdp_plugin=fsdp,
                                       gradient_accumulation_plugin=accumulation)
        kind = self.accelerator.distributed_type
        if fsdp is not None and kind != DistributedType.FSDP:  # its finding: the plugin ignored on a CPU
            raise Unsupported(f"accelerate applies its FSDP plugin on accelerators only: here its distributed type is "
                              f"{kind.value} and the model would be wrapped in DDP, the plugin ignored without a word "
                              "(ZeRO 2 / 3 run on a GPU node).")

    def _build(self, model):
        optimizer = self.recipe.optimizer.build(model.parameters())
        self.scheduler = None
        plan = self.recipe.lr_schedule
        if plan is not None:  # prepared, accelerate steps it num_processes times per update (split_batches off, its
            # default; suites/stack/test_accelerate.py's watch): the schedule written in those steps
            n = self.accelerator.num_processes
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: plan.factor(i // n))
            self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        else:
            self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.module = self.accelerator.unwrap_model(self.model)
        return self.model

    def step(self, tokens, targets) -> float:
        from harness.stack.inputs import replica_rows, summed_cross_entropy, token_share

        model, acc, recipe, k = self.trainer, self.accelerator, self.recipe, self.recipe.accumulation
        device = acc.device
        mine, theirs, rows = replica_rows(tokens, targets, self.layout.dp, acc.process_index, k)
        share = token_share(targets, self.layout.dp * k)  # accelerate averages micro-steps and replicas
        total, self.last_grad_norm = 0.0, None
        for a in range(k):
            part = slice(a * rows, (a + 1) * rows)
            with acc.accumulate(model):
                loss = summed_cross_entropy(model(mine[part].to(device)), theirs[part].to(device)) / share
                acc.backward(loss)  # divides by the accumulation steps
                if acc.sync_gradients and recipe.max_grad_norm is not None:
                    norm = acc.clip_grad_norm_(model.parameters(), recipe.max_grad_norm, recipe.norm_type)
                    self.last_grad_norm = float(norm)
                self.optimizer.step()  # a no-op until the step that syncs
                if self.scheduler is not None:  # likewise (AcceleratedScheduler: only with the optimizer's step)
                    self.scheduler.step()
                self.optimizer.zero_grad()
            total += float(loss.detach()) / k
        return summed([total / self.layout.dp])[0]

    def dense_state(self) -> dict:
        from harness.stack.dense import full_tensors

        module, inner = self.module, self.optimizer.optimizer  # the torch optimizer behind AcceleratedOptimizer
        keys = self.recipe.optimizer.state_keys
        full = full_tensors({"params": {n: p.detach() for n, p in module.named_parameters()},
                             "optimizer": {n: {k: inner.state[p][k] for k in keys if k in inner.state.get(p, {})}
                                           for n, p in module.named_parameters()}})
        params, optimizer = full["params"], full["optimizer"]
        if self.spec.tie_embeddings:
            tied(params, optimizer)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
