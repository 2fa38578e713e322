"""DeepSpeed's engine under the stack contract: ``deepspeed.initialize`` over the one-device model of the
spec (DeepSpeed has no model classes of its own: the engine is its training code) — ZeRO stage 0-3 over dp,
its gradient accumulation (``gradient_accumulation_steps``: the engine divides each micro-step's loss and
steps at the boundary), its gradient clipping (``gradient_clipping``: the global 2-norm), the client torch
optimizer (SGD with momentum or Adam), float32.

Each replica takes its rows of the global batch; each micro-step's loss is its summed cross-entropy divided by
its share of the global batch's counted targets (``token_share`` over dp x accumulation): the engine averages
micro-steps and replicas, and a padded batch counts differently in each — how the HF Trainer weighs a DeepSpeed
loss (``num_items_in_batch``).

The options users set (docs/guides/stacks.md), each a stack of its own here (``--impl
harness.adapters.deepspeed_stack:<name>``): ``CallerScalesLoss`` — the caller divides by the accumulation steps
and calls ``engine.backward(loss, scale_wrt_gas=False)``, as accelerate and the HF Trainer do;
``Fp32GradAccum`` — ``data_types.grad_accum_dtype`` fp32 (a bf16 model's gradients accumulated in fp32: its
BF16_Optimizer at ZeRO 1; DeepSpeed refuses the mix at ZeRO 0 with NotImplementedError: unsupported).

Full state through DeepSpeed's own API: ``GatheredParameters`` (stage 3) and ``safe_get_full_optimizer_state``
(stage 0: the client optimizer's state). A tied embedding is one parameter for DeepSpeed too: reported under
both names, its state once.

bf16 is DeepSpeed's own recipe (``bf16_config``: it rounds the model; fp32 masters and state, read by
``MastersState``). pp > 1 and activation checkpointing are its ``PipelineModule`` (``deepspeed_pipe.py``);
``save`` / ``load`` are its checkpoints, universal across dp (``deepspeed_resume.py``). Not here: tensor
parallelism (DeepSpeed's AutoTP is an inference / HF path), fp16 (its loss scaler's own rule:
suites/mixed_precision). The moe family is its MoE layer inside this engine (``deepspeed_moe_stack.py``), cp its
Ulysses attention (``deepspeed_ulysses_stack.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..contracts import Unsupported
from .deepspeed_mixed import MastersState, bf16_config
from .deepspeed_resume import DeepSpeedCheckpoint
from .dense_built import BuiltFromDense


def _unsupported(spec, layout, recipe) -> str | None:
    if layout.tp > 1 or layout.sequence_parallel:
        return ("the DeepSpeed stack here is its engine over data parallelism (ZeRO 0-3), its PipelineModule, its MoE "
                "and its Ulysses; its AutoTP (an inference / HF path) is not composed into it.")
    if layout.cp > 1:
        from .deepspeed_ulysses_stack import unsupported as ulysses

        why = ulysses(spec, layout, recipe)
        if why:
            return why
    if layout.ep > 1 and spec.family != "moe":
        return f"ep = {layout.ep} splits experts: the {spec.family} family has none."
    if spec.family == "moe":
        from .deepspeed_moe_stack import unsupported

        why = unsupported(spec, layout, recipe)
        if why:
            return why
    if spec.dropout:
        return "the DeepSpeed stack trains without dropout (the one-device masks are keyed by a step it never sets)."
    if layout.pp > 1 or layout.checkpointing:
        if layout.zero > 1:
            return (f"DeepSpeed's PipelineEngine asserts ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism "
                    f"(asked: ZeRO {layout.zero}).")
        if layout.schedule != "1f1b":
            return f"DeepSpeed's PipelineEngine runs its 1F1B TrainSchedule only, not {layout.schedule}."
    if spec.dtype not in ("float32", "bfloat16"):
        return (f"the DeepSpeed stack here trains float32 and bf16 (fp16's loss scaler is its own rule: "
                f"suites/mixed_precision); not {spec.dtype}.")
    if spec.extra or layout.extra:
        return f"the DeepSpeed stack does not know {', '.join(sorted({**spec.extra, **layout.extra}))}."
    if recipe.max_grad_norm is not None and recipe.norm_type != 2.0:
        return f"DeepSpeed's gradient_clipping clips the 2-norm, not the {recipe.norm_type} norm."
    if recipe.loss_scale is not None:
        return "the DeepSpeed stack here has no loss scaler (float32 needs none)."
    return None


class DeepSpeedStack:
    description = "DeepSpeed's engine: deepspeed.initialize, ZeRO 0-3 over dp, accumulation, clipping (float32)"

    config: dict = {}
    """DeepSpeed config entries an option adds to the engine's (``engine_config``, ``bf16_config``)."""
    scale_wrt_gas = True
    """``engine.backward``'s: True, the engine divides by the accumulation steps; False, the caller does."""

    def build(self, spec, layout, recipe, group=None):
        why = _unsupported(spec, layout, recipe)
        if why:
            raise Unsupported(why)
        if group not in (None, dist.group.WORLD):
            raise Unsupported("DeepSpeed's data-parallel group is the world here (no group argument).")
        if spec.family == "moe" and spec.experts % layout.ep:
            raise ValueError(f"the {spec.experts} experts do not split evenly over ep = {layout.ep} (DeepSpeed asserts "
                             "num_experts % ep_size == 0).")
        if layout.pp > 1 or layout.checkpointing:  # DeepSpeed's activation checkpointing is its PipelineModule's
            if not self.scale_wrt_gas:
                raise Unsupported("the caller's own loss scaling is engine.backward's option; the PipelineEngine's "
                                  "train_batch runs the backward itself.")
            from .deepspeed_pipe import DeepSpeedPipeTrainer

            return DeepSpeedPipeTrainer(spec, layout, recipe, self.config)
        return DeepSpeedStackTrainer(spec, layout, recipe, self.config, self.scale_wrt_gas)


class CallerScalesLoss(DeepSpeedStack):
    description = "DeepSpeed's engine, the caller dividing the loss by the accumulation steps (scale_wrt_gas=False)"
    scale_wrt_gas = False


class Fp32GradAccum(DeepSpeedStack):
    description = "DeepSpeed's engine, a bf16 model's gradients accumulated in fp32 (data_types.grad_accum_dtype)"
    config = {"data_types": {"grad_accum_dtype": "fp32"}}

    def build(self, spec, layout, recipe, group=None):
        if spec.dtype == "bfloat16" and layout.zero == 0 and layout.pp == 1 and not layout.checkpointing:
            raise Unsupported("DeepSpeed refuses a bf16 model with fp32 gradient accumulation at ZeRO 0 "
                              "(NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype).")
        return super().build(spec, layout, recipe, group)


class DeepSpeedStackTrainer(DeepSpeedCheckpoint, BuiltFromDense):
    def __init__(self, spec, layout, recipe, config=None, scale_wrt_gas: bool = True):
        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.config, self.scale_wrt_gas = config or {}, scale_wrt_gas
        self.last_grad_norm, self.names, self.relink = None, {}, True
        """{the engine's parameter name: the one-device model's} where they differ (the moe family's)."""

    @property
    def engine(self):
        return self.trainer

    def _build(self, model):
        from .deepspeed_init import init
        from .deepspeed_zero import _Trainer, engine_config

        init()
        import deepspeed

        recipe = self.recipe
        config = {**engine_config(self.layout.zero, recipe.accumulation, recipe.max_grad_norm),
                  **bf16_config(self.spec), **self.config}
        mpu = None
        if self.layout.cp > 1:  # every attention DeepSpeed-Ulysses', the engine given its sequence-parallel state
            from .deepspeed_ulysses_stack import ulysses_model

            model, mpu = ulysses_model(model, self.layout.cp)
        model = model.float()  # bf16: DeepSpeed rounds the model itself; its fp32 masters are the rounded weights
        groups = model.parameters()
        if self.spec.family == "moe":  # every block's MoE DeepSpeed's, its optimizer groups split as ZeRO asserts
            from .deepspeed_moe_stack import MoEModel, contract_names, optimizer_groups

            model = MoEModel(model, self.layout.ep)
            groups, self.names = optimizer_groups(model), contract_names(model)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=recipe.optimizer.build(groups),
                                                       config=config, mpu=mpu)
        if self.spec.family == "moe":  # each rank loaded the experts its EP group routes to it
            for block in model.blocks:
                block.check()
        # the ZeRO adapter's reading of DeepSpeed's full state (GatheredParameters, safe_get_full_optimizer_state)
        names = [name for name, _ in model.named_parameters()]
        self.state = (MastersState if self.spec.dtype == "bfloat16" else _Trainer)(
            engine, optimizer, recipe.optimizer, self.layout.zero, names, None)
        return engine

    def step(self, tokens, targets) -> float:
        from ..stack.inputs import replica_rows, summed_cross_entropy, token_share

        engine, k, dp, cp = self.trainer, self.recipe.accumulation, self.layout.dp, self.layout.cp
        mine, theirs, rows = replica_rows(tokens, targets, dp, dist.get_rank() // cp, k)
        if cp > 1:  # its sequence shard: the engine sums over data x sequence ranks and divides by dp
            from .deepspeed_ulysses_stack import shard

            mine, theirs = shard(mine, theirs, cp)
        share = token_share(targets, dp * k)  # DeepSpeed averages micro-steps and replicas: each its share
        total = 0.0
        for a in range(k):
            part = slice(a * rows, (a + 1) * rows)
            out = engine(mine[part])  # through its forward
            if self.spec.family == "moe":  # + the balance loss: the engine averages, so its share is the rows'
                out, aux = out
                loss = summed_cross_entropy(out, theirs[part]) / share + self.spec.aux_coef * aux / rows
            else:
                loss = summed_cross_entropy(out, theirs[part]) / share
            if self.scale_wrt_gas:
                engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
            else:  # the caller does (accelerate, the HF Trainer), and tells the engine not to
                engine.backward(loss / k, scale_wrt_gas=False)
            engine.step()  # a no-op until the accumulation boundary
            total += float(loss.detach()) / k
        if self.recipe.max_grad_norm is not None:
            norm = engine.get_global_grad_norm()
            self.last_grad_norm = None if norm is None else float(norm)
        value = torch.tensor([total / dp], dtype=torch.float64)
        dist.all_reduce(value)
        return float(value)

    def memory(self) -> dict:
        from .deepspeed_zero import engine_memory

        return engine_memory(self.engine)

    def dense_state(self) -> dict:
        if self.spec.family == "moe" and self.layout.zero in (1, 2) and self.relink:
            from .deepspeed_moe_stack import relink_optimizer_state

            relink_optimizer_state(self.engine.optimizer)
        params = {self.names.get(k, k): v.cpu() for k, v in self.state.full_params().items()}
        optimizer = {self.names.get(k, k): {key: t.detach().cpu() for key, t in v.items()} for k, v in
                     self.state.full_optimizer_state().items()}
        if self.spec.family == "moe":  # every expert, on every rank
            from .deepspeed_moe_stack import every_expert

            params, optimizer = (every_expert(d, self.engine.module) for d in (params, optimizer))
        if self.spec.tie_embeddings and "head.weight" not in params:  # one parameter: both names, state once
            params["head.weight"] = params["embed.weight"]
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
