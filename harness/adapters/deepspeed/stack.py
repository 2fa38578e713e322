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
harness.adapters.deepspeed.stack:<name>``): ``CallerScalesLoss`` — the caller divides by the accumulation steps
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

from harness.adapters.deepspeed.mixed import MastersState, bf16_config
from harness.adapters.deepspeed.resume import DeepSpeedCheckpoint
from harness.contracts import Unsupported
from harness.runtime.rank import summed
from harness.stack.built import BuiltFromDense
from harness.stack.dense import tied
from harness.stack.supports import Rule, Supports


def _ulysses(spec, layout, recipe) -> str | None:
    from harness.adapters.deepspeed.ulysses_stack import unsupported

    return unsupported(spec, layout, recipe)


def _moe(spec, layout, recipe) -> str | None:
    from harness.adapters.deepspeed.moe_stack import unsupported

    return unsupported(spec, layout, recipe)


def _piped(spec, layout, recipe) -> bool:
    return layout.pp > 1 or layout.checkpointing  # DeepSpeed's activation checkpointing is its PipelineModule's


SUPPORTS = Supports("the DeepSpeed stack", unsupported=(
    Rule(lambda s, lay, r: r.optimizer.name == "muon" and (lay.pp > 1 or lay.cp > 1 or s.family == "moe"
                                                          or s.dtype != "float32"),
         "the DeepSpeed stack trains Muon (its MuonWithAuxAdam) in its engine over data parallelism, a float32 dense "
         "model; its PipelineModule, Ulysses and MoE with Muon are not driven."),
    Rule(lambda s, lay, r: r.optimizer.name == "muon" and (r.optimizer.adjust_lr_fn not in (None, "original")
                                                          or not r.optimizer.nesterov),
         "DeepSpeed's Muon is Nesterov's, its update scaled by sqrt(max(1, rows / cols)) (torch's \"original\"); "
         "plain momentum, match_rms_adamw and spectral_unclamped are not its."),
    Rule(lambda s, lay, r: r.low_precision is not None,
         "DeepSpeed has no float8 / MX recipe of its own for these layers (its FP8 path is TransformerEngine's, CUDA "
         "only)."),
    Rule(lambda s, lay, r: lay.tp > 1 or lay.sequence_parallel,
         "the DeepSpeed stack here is its engine over data parallelism (ZeRO 0-3), its PipelineModule, its MoE and its "
         "Ulysses; its AutoTP (an inference / HF path) is not composed into it."),
    Rule(lambda s, lay, r: lay.cp > 1, _ulysses),
    Rule(lambda s, lay, r: lay.ep > 1 and s.family != "moe",
         lambda s, lay, r: f"ep = {lay.ep} splits experts: the {s.family} family has none."),
    Rule(lambda s, lay, r: s.family == "moe", _moe),
    Rule(lambda s, lay, r: bool(s.dropout),
         "the DeepSpeed stack trains without dropout (the one-device masks are keyed by a step it never sets)."),
    Rule(lambda s, lay, r: _piped(s, lay, r) and lay.zero > 1,
         lambda s, lay, r: "DeepSpeed's PipelineEngine asserts ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                           f"parallelism (asked: ZeRO {lay.zero})."),
    Rule(lambda s, lay, r: _piped(s, lay, r) and lay.schedule != "1f1b",
         lambda s, lay, r: f"DeepSpeed's PipelineEngine runs its 1F1B TrainSchedule only, not {lay.schedule}."),
    Rule(lambda s, lay, r: s.dtype not in ("float32", "bfloat16"),
         lambda s, lay, r: "the DeepSpeed stack here trains float32 and bf16 (fp16's loss scaler is its own rule: "
                           f"suites/mixed_precision); not {s.dtype}."),
    Rule(lambda s, lay, r: r.max_grad_norm is not None and r.norm_type != 2.0,
         lambda s, lay, r: f"DeepSpeed's gradient_clipping clips the 2-norm, not the {r.norm_type} norm."),
    Rule(lambda s, lay, r: r.loss_scale is not None,
         "the DeepSpeed stack here has no loss scaler (float32 needs none)."),
), optimizers=("sgd", "adam", "adamw", "muon"), schedules=True, refused=(
    Rule(lambda s, lay, r: s.family == "moe" and s.experts % lay.ep,
         lambda s, lay, r: f"the {s.experts} experts do not split evenly over ep = {lay.ep} (DeepSpeed asserts "
                           "num_experts % ep_size == 0)."),
))


class DeepSpeedStack:
    description = "DeepSpeed's engine: deepspeed.initialize, ZeRO 0-3 over dp, accumulation, clipping (float32)"

    config: dict = {}
    """DeepSpeed config entries an option adds to the engine's (``engine_config``, ``bf16_config``)."""
    scale_wrt_gas = True
    """``engine.backward``'s: True, the engine divides by the accumulation steps; False, the caller does."""
    zero_init = False
    """Whether the model is constructed inside ``deepspeed.zero.Init`` (ZeRO 3: ``ZeroInit``)."""

    def build(self, spec, layout, recipe, group=None):
        if group not in (None, dist.group.WORLD):
            raise Unsupported("DeepSpeed's data-parallel group is the world here (no group argument).")
        SUPPORTS.check(spec, layout, recipe)
        if _piped(spec, layout, recipe):
            if not self.scale_wrt_gas:
                raise Unsupported("the caller's own loss scaling is engine.backward's option; the PipelineEngine's "
                                  "train_batch runs the backward itself.")
            from harness.adapters.deepspeed.stack_pipe import DeepSpeedPipeTrainer

            return DeepSpeedPipeTrainer(spec, layout, recipe, self.entries(layout))
        return DeepSpeedStackTrainer(spec, layout, recipe, self.entries(layout), self.scale_wrt_gas, self.zero_init)

    def entries(self, layout) -> dict:
        """The config entries this option adds to the engine's on ``layout`` (``config``)."""
        return self.config


class CallerScalesLoss(DeepSpeedStack):
    description = "DeepSpeed's engine, the caller dividing the loss by the accumulation steps (scale_wrt_gas=False)"
    scale_wrt_gas = False


class ZeroInit(DeepSpeedStack):
    description = ("DeepSpeed's engine at ZeRO 3, the model constructed inside deepspeed.zero.Init (each parameter "
                   "partitioned as it is made, its layer shape only in ds_shape)")
    zero_init = True

    def build(self, spec, layout, recipe, group=None):
        if layout.zero != 3:
            raise Unsupported(f"deepspeed.zero.Init partitions parameters at construction: ZeRO 3's, not ZeRO "
                              f"{layout.zero}'s.")
        if spec.family == "moe" or layout.cp > 1 or _piped(spec, layout, recipe):
            raise Unsupported("the model is constructed inside deepspeed.zero.Init for the dense families over data "
                              "parallelism; its MoE, Ulysses and PipelineModule wrap a model built outside.")
        return super().build(spec, layout, recipe, group)


class Hpz(DeepSpeedStack):
    description = ("DeepSpeed's engine at ZeRO 3 with ZeRO++'s hierarchical partitioning (hpZ: "
                   "zero_hpz_partition_size 2, a secondary copy of the parameters sharded within groups of 2 ranks "
                   "for the backward's all-gathers)")
    config = {"zero_optimization": {"zero_hpz_partition_size": 2}}

    def build(self, spec, layout, recipe, group=None):
        if layout.zero != 3:
            raise Unsupported(f"ZeRO++'s hpZ partitions ZeRO 3's parameters a second time, not ZeRO {layout.zero}'s.")
        return super().build(spec, layout, recipe, group)


class Offload(DeepSpeedStack):
    description = ("DeepSpeed's engine with ZeRO-Offload: the optimizer's state, masters and step on the host "
                   "(offload_optimizer cpu, ZeRO 1-3), and at ZeRO 3 the parameters too (offload_param cpu)")

    def build(self, spec, layout, recipe, group=None):
        if layout.zero == 0:
            raise Unsupported("ZeRO-Offload moves ZeRO's sharded state to the host: ZeRO 0 shards none.")
        return super().build(spec, layout, recipe, group)

    def entries(self, layout) -> dict:
        from harness.adapters.deepspeed.zero import offload_config

        return offload_config(layout.zero)


class Fp32GradAccum(DeepSpeedStack):
    description = "DeepSpeed's engine, a bf16 model's gradients accumulated in fp32 (data_types.grad_accum_dtype)"
    config = {"data_types": {"grad_accum_dtype": "fp32"}}

    def build(self, spec, layout, recipe, group=None):
        if spec.dtype == "bfloat16" and layout.zero == 0 and layout.pp == 1 and not layout.checkpointing:
            raise Unsupported("DeepSpeed refuses a bf16 model with fp32 gradient accumulation at ZeRO 0 "
                              "(NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype).")
        return super().build(spec, layout, recipe, group)


def put_back_init_subclass(found) -> None:
    """``torch.nn.Module.__init_subclass__`` as it was before a ``zero.Init`` context: ``found`` (what
    ``Module.__dict__`` held then; None: nothing of its own, object's inherited)."""
    if torch.nn.Module.__dict__.get("__init_subclass__") is not found:
        if found is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = found


def partitioned_at_construction(spec, dense, config):
    """``spec``'s model constructed inside ``deepspeed.zero.Init`` (``config``'s ZeRO 3), each partitioned parameter
    then given ``dense``'s weights (the one-device model's, the same on every rank) under ``GatheredParameters``.
    ``torch.nn.Module.__init_subclass__`` is put back as it was found (a known finding: DeepSpeed leaves its own there,
    which hides every later class's mixin hooks — torchtitan's Configurable among them)."""
    import deepspeed

    found = torch.nn.Module.__dict__.get("__init_subclass__")
    try:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = spec.build(0).float()
    finally:
        put_back_init_subclass(found)
    if not all(hasattr(p, "ds_id") for p in model.parameters()):  # else the case would not run the path
        raise Unsupported(f"DeepSpeed {deepspeed.__version__}'s zero.Init left parameters unpartitioned.")
    weights = dict(dense.named_parameters())
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0), torch.no_grad():
            if dist.get_rank() == 0:
                p.copy_(weights[name])
    return model


def require_secondary_partition(model, size: int) -> None:
    """Every parameter of the engine's ``model`` given hpZ's secondary group of ``size`` ranks, else the case would
    not run the path (a release that took the config and made no such group): unsupported, in one sentence."""
    import deepspeed

    groups = {getattr(p, "ds_zero_param_process_group", None) for p in model.parameters()}
    if None in groups or {dist.get_world_size(g) for g in groups} != {size}:
        raise Unsupported(f"DeepSpeed {deepspeed.__version__} took zero_hpz_partition_size {size} but gave its "
                          f"parameters no secondary group of {size} ranks: the case would not run hpZ's path.")


def muon_config(model, spec) -> dict:
    """DeepSpeed's config for its Muon (``MuonWithAuxAdam``) as ``spec`` (``OptimizerSpec("muon", ...)``) says: each
    parameter of ``model`` tagged ``use_muon`` by the contract's rule (its one-device name and shape), the Muon half's
    lr / momentum / weight decay, its AdamW half's lr / betas / eps / weight decay, and the "standard" Newton-Schulz
    (Keller Jordan's quintic — torch's iteration, bfloat16 where the accelerator has it; DeepSpeed's default "gram"
    is another iteration); its AdamW half torch's (``torch_adam``: no fused op to build)."""
    muon = spec.muon()
    for name, p in model.named_parameters():  # a zero.Init parameter's layer shape is its ds_shape
        p.use_muon = muon.takes(name, tuple(getattr(p, "ds_shape", p.shape)))
    return {"type": "Muon", "params": {"lr": muon.lr, "muon_lr": muon.lr, "adam_lr": muon.adamw_lr,
                                       "momentum": muon.momentum, "betas": list(muon.adamw_betas),
                                       "eps": muon.adamw_eps, "weight_decay": muon.weight_decay,
                                       "ns_method": "standard", "torch_adam": True}}


class DeepSpeedStackTrainer(DeepSpeedCheckpoint, BuiltFromDense):
    def __init__(self, spec, layout, recipe, config=None, scale_wrt_gas: bool = True, zero_init: bool = False):
        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.config, self.scale_wrt_gas, self.zero_init = config or {}, scale_wrt_gas, zero_init
        self.last_grad_norm, self.names, self.relink = None, {}, True
        """{the engine's parameter name: the one-device model's} where they differ (the moe family's)."""

    @property
    def engine(self):
        return self.trainer

    def _build(self, model):
        from harness.adapters.deepspeed.init import init
        from harness.adapters.deepspeed.zero import _Trainer, client_scheduler, engine_config, merged, require_offload

        init()
        import deepspeed

        recipe = self.recipe
        config = merged(engine_config(self.layout.zero, recipe.accumulation, recipe.max_grad_norm),
                        bf16_config(self.spec), self.config)
        mpu = None
        if self.layout.cp > 1:  # every attention DeepSpeed-Ulysses', the engine given its sequence-parallel state
            from harness.adapters.deepspeed.ulysses_stack import ulysses_model

            model, mpu = ulysses_model(model, self.layout.cp)
        model = model.float()  # bf16: DeepSpeed rounds the model itself; its fp32 masters are the rounded weights
        if self.zero_init:
            model = partitioned_at_construction(self.spec, model, config)
        groups = model.parameters()
        if self.spec.family == "moe":  # every block's MoE DeepSpeed's, its optimizer groups split as ZeRO asserts
            from harness.adapters.deepspeed.moe_stack import MoEModel, contract_names, optimizer_groups

            model = MoEModel(model, self.layout.ep)
            groups, self.names = optimizer_groups(model), contract_names(model)
        if recipe.optimizer.name == "muon":  # its Muon from its config, every parameter tagged use_muon
            config["optimizer"] = muon_config(model, recipe.optimizer)
            if self.layout.zero == 3:  # its stage 3 refuses Muon with reduce-scatter ("cannot be used together")
                config["zero_optimization"] = {**config["zero_optimization"], "reduce_scatter": False}
            built = {"model_parameters": model.parameters()}
        else:
            built = {"optimizer": recipe.optimizer.build(groups)}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, mpu=mpu, **built,
                                                       **client_scheduler(recipe.lr_schedule))
        require_offload(config, optimizer)  # where an option offloads
        hpz = config["zero_optimization"].get("zero_hpz_partition_size", 1)
        if hpz > 1:
            require_secondary_partition(model, hpz)
        if self.spec.family == "moe":  # each rank loaded the experts its EP group routes to it
            for block in model.blocks:
                block.check()
        # the ZeRO adapter's reading of DeepSpeed's full state (GatheredParameters, safe_get_full_optimizer_state)
        names = [name for name, _ in model.named_parameters()]
        self.state = (MastersState if self.spec.dtype == "bfloat16" else _Trainer)(
            engine, optimizer, recipe.optimizer, self.layout.zero, names, None)
        return engine

    def step(self, tokens, targets) -> float:
        from harness.stack.inputs import replica_rows, summed_cross_entropy, token_share

        engine, k, dp, cp = self.trainer, self.recipe.accumulation, self.layout.dp, self.layout.cp
        mine, theirs, rows = replica_rows(tokens, targets, dp, dist.get_rank() // cp, k)
        if cp > 1:  # its sequence shard: the engine sums over data x sequence ranks and divides by dp
            from harness.adapters.deepspeed.ulysses_stack import shard

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
        return summed([total / dp])[0]

    def memory(self) -> dict:
        from harness.adapters.deepspeed.zero import engine_memory

        return engine_memory(self.engine)

    def dense_state(self) -> dict:
        # its Muon's AdamW half, a MoE's expert groups, AdamW's undecayed vectors: a later parameter group, whose
        # state the reader re-links (the known finding) unless the watch turned it off
        self.state.relink = self.relink
        params = {self.names.get(k, k): v.cpu() for k, v in self.state.full_params().items()}
        optimizer = {self.names.get(k, k): {key: t.detach().cpu() for key, t in v.items()} for k, v in
                     self.state.full_optimizer_state().items()}
        if self.spec.family == "moe":  # every expert, on every rank
            from harness.adapters.deepspeed.moe_stack import every_expert

            params, optimizer = (every_expert(d, self.engine.module) for d in (params, optimizer))
        if self.spec.tie_embeddings:
            tied(params, optimizer)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
