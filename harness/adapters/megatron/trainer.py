"""The Megatron stack's trainer: megatron-core's model, parallel state, schedules, DDP and optimizer built from a
one-device model, Megatron-LM's train step, and the dense state read back (harness.adapters.megatron.stack: what
it chooses and why)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from harness.adapters.megatron.checkpoint import MegatronCheckpoint
from harness.adapters.megatron.cpu import on_cpu
from harness.adapters.megatron.names import _global_names, _local, _main_params, _scatter_dense
from harness.adapters.megatron.tensor_parallel import _padded
from harness.runtime.rank import summed
from harness.stack.built import BuiltFromDense
from reference.errors import Unsupported

_ACTIVE: list = [None]
"""The (tp, pp, vp) megatron-core's parallel state was last initialised with by this adapter (None: not by it)."""


def lr_arguments(lr: float, schedule) -> dict:
    """``OptimizerParamScheduler``'s learning-rate arguments for the contract's ``schedule`` (None: constant at lr) —
    the contract's convention is its own (``reference.zero.lr_schedule``): init_lr the warmup's start, its WSD style
    for a stable peak. In iterations, stepped by 1 (Megatron-LM counts samples: warmup, decay and each increment
    times the global batch — the same ratios, exactly)."""
    if schedule is None:
        return {"init_lr": lr, "max_lr": lr, "min_lr": 0.0, "lr_warmup_steps": 0, "lr_decay_steps": 1,
                "lr_decay_style": "constant"}
    out = {"init_lr": schedule.start * lr if schedule.warmup else lr, "max_lr": lr,
           "min_lr": schedule.min_ratio * lr, "lr_warmup_steps": schedule.warmup}
    if schedule.decay == "constant":
        return {**out, "lr_decay_steps": schedule.warmup + 1, "lr_decay_style": "constant"}
    if schedule.stable:
        return {**out, "lr_decay_steps": schedule.total, "lr_decay_style": "WSD",
                "wsd_decay_steps": schedule.total - schedule.decay_begins, "lr_wsd_decay_style": schedule.decay}
    return {**out, "lr_decay_steps": schedule.total, "lr_decay_style": schedule.decay}


STATE_READERS = ("_get_model_param_range_map", "_get_main_param_and_optimizer_states")
"""megatron-core's distributed optimizer's readers of a parameter's range on this rank and its fp32 main shard and
optimizer state there — private (it has no public per-parameter read): ``dense_state`` reads the ZeRO 1 state
through them."""


def distributed_optimizer_readable() -> None:
    """Unsupported (one sentence, before anything is built) where this megatron-core's ``DistributedOptimizer`` has no
    ``STATE_READERS``: its sharded state could not be read back, so ZeRO 1 is not held here."""
    try:
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    except ImportError as exc:
        raise Unsupported(f"megatron-core's distributed optimizer does not import here ({exc}): ZeRO 1 is not held "
                          "here.") from None
    missing = [name for name in STATE_READERS if not callable(getattr(DistributedOptimizer, name, None))]
    if missing:
        raise Unsupported(f"this megatron-core's DistributedOptimizer has no {' / '.join(missing)}: its sharded state "
                          "cannot be read back per parameter, so ZeRO 1 is not held here.")


class MegatronStackTrainer(MegatronCheckpoint, BuiltFromDense):
    perform_initialization = True
    """Megatron initialises its weights (then the one-device weights are loaded over them): with
    ``perform_initialization=False`` megatron-core 0.16 never marks its column / row / vocabulary-parallel weights
    ``tensor_model_parallel`` (``set_tensor_model_parallel_attributes`` runs inside its initialisers only), so its
    grad norm counts them on TP rank 0 alone (the finding; suites/stack/test_megatron.py watches it)."""

    def __init__(self, spec, layout, recipe, ddp_options: dict | None = None):
        self.spec, self.layout, self.recipe = spec, layout, recipe
        self.ddp_options = ddp_options or {}
        """``DistributedDataParallelConfig`` fields an option sets (``OverlapGradReduce``)."""
        self.vp = 2 if layout.schedule == "interleaved" and layout.pp > 1 else None
        self.last_grad_norm = None
        self.mixed = spec.dtype == "bfloat16"
        """bf16 with fp32 main params: Float16OptimizerWithFloat16Params (ZeRO 0), the distributed optimizer's
        fp32 shards (ZeRO 1); gradients accumulated and reduced in fp32 (grad_reduce_in_fp32)."""
        self.dtype = torch.bfloat16 if self.mixed else torch.float32

    def _config(self):
        from megatron.core.transformer.transformer_config import TransformerConfig

        spec, layout = self.spec, self.layout
        llama = spec.family == "llama"
        split = {}
        if layout.pp > 1 and self.vp is None and spec.layers % layout.pp:  # Megatron's uneven split
            base = spec.layers // layout.pp
            split = {"num_layers_in_first_pipeline_stage": spec.layers - base * (layout.pp - 1),
                     "num_layers_in_last_pipeline_stage": base}
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform",
                     "recompute_num_layers": 1} if layout.checkpointing else {}
        return TransformerConfig(
            num_layers=spec.layers, hidden_size=spec.hidden, num_attention_heads=spec.heads,
            num_query_groups=spec.kv, ffn_hidden_size=spec.ffn, kv_channels=spec.hidden // spec.heads,
            normalization="RMSNorm" if llama else "LayerNorm", layernorm_epsilon=spec.norm_eps if llama else 1e-5,
            gated_linear_unit=llama, activation_func=torch.nn.functional.silu if llama else torch.nn.functional.gelu,
            add_bias_linear=not llama, hidden_dropout=0.0, attention_dropout=0.0,
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=self.vp, sequence_parallel=layout.sequence_parallel,
            use_cpu_initialization=True, perform_initialization=self.perform_initialization,
            params_dtype=self.dtype, pipeline_dtype=self.dtype, bf16=self.mixed, fp16=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
            persist_layer_norm=False, gradient_accumulation_fusion=False, calculate_per_token_loss=True,
            **self._p2p(), **split, **recompute)

    batched_p2p = False
    """Megatron-LM's p2p for the interleaved schedule (``overlap_p2p_comm``, not ``batch_p2p_comm``: its
    arguments make them exclusive, overlap the default). megatron-core's config default, batched, posts
    send_prev, recv_prev, send_next, recv_next on every rank: at pp = 2 the next and the previous rank are one
    peer, so an activation and a gradient travel the same way in one batch and each lands in the other's buffer
    (the finding; the suite's watch sets this True)."""

    def _p2p(self) -> dict:
        if self.vp is None:
            return {}
        return {"batch_p2p_comm": self.batched_p2p, "overlap_p2p_comm": not self.batched_p2p}

    def _build(self, model):
        with on_cpu():
            return self._build_megatron(model)

    def _build_megatron(self, model):
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.module import Float16Module

        spec, layout, recipe = self.spec, self.layout, self.recipe
        _ACTIVE[0] = None
        self.activate()
        model_parallel_cuda_manual_seed(0)
        config = self._config()
        llama = spec.family == "llama"
        layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm" if llama else "LayerNorm")
        self.tp_rank, self.vocab_padded = ps.get_tensor_model_parallel_rank(), _padded(spec.vocab, layout.tp)
        dense = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
        self.shapes = {k: tuple(v.shape) for k, v in dense.items()}  # dense_state's tensors, under both tied names
        ddp_config = DistributedDataParallelConfig(**{"grad_reduce_in_fp32": True, "overlap_grad_reduce": False,
                                                      "use_distributed_optimizer": layout.zero == 1,
                                                      **self.ddp_options})
        chunks = []
        for vp_stage in range(self.vp or 1):
            vp = vp_stage if self.vp else None
            gpt = GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=self.vocab_padded,
                           max_sequence_length=64, position_embedding_type="rope" if llama else "none",
                           rotary_base=spec.rope_theta, share_embeddings_and_output_weights=spec.tie_embeddings,
                           pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                           post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp), vp_stage=vp)
            with torch.no_grad():
                for p, name in _global_names(gpt).items():
                    p.copy_(_local(spec, self._dense_name_of(name), layout.tp, self.tp_rank, self.vocab_padded, dense))
            if self.mixed:  # Megatron-LM's get_model: the whole chunk in bf16 (its torch norms are built fp32)
                gpt = Float16Module(config, gpt)
            chunks.append(DistributedDataParallel(config, ddp_config, gpt))
        opt = recipe.optimizer
        # its "adam" is AdamW (decoupled_weight_decay, its default); its standard overrides (config_overrides None)
        # give a bias or a 1-D parameter wd_mult 0 — AdamW's rule "matrices"; {} (no overrides) decays every one
        # lr and min_lr: each group's max_lr and min_lr, which its scheduler reads (Megatron-LM's --lr, --min-lr)
        floor = recipe.lr_schedule.min_ratio * opt.lr if recipe.lr_schedule is not None else None
        kwargs = {"optimizer": "sgd" if opt.name == "sgd" else "adam", "lr": opt.lr, "min_lr": floor,
                  "weight_decay": opt.weight_decay,
                  "params_dtype": self.dtype,
                  "bf16": self.mixed,
                  "clip_grad": recipe.max_grad_norm or 0.0, "use_distributed_optimizer": layout.zero == 1}
        kwargs |= {"sgd_momentum": opt.momentum} if opt.name == "sgd" else \
            {"adam_beta1": opt.betas[0], "adam_beta2": opt.betas[1], "adam_eps": opt.eps}
        every = {}
        if opt.name == "adamw" and opt.decay == "all":  # no overrides: every parameter at the config's decay
            import inspect

            if "config_overrides" not in inspect.signature(get_megatron_optimizer).parameters:
                raise Unsupported("this megatron-core's get_megatron_optimizer has no config_overrides: its "
                                  "no_weight_decay_cond spares the biases and norms (AdamW's rule 'matrices'); "
                                  "decaying every parameter is not set here.")
            every = {"config_overrides": {}}
        self.optimizer = get_megatron_optimizer(OptimizerConfig(**kwargs), chunks, **every)
        # Megatron-LM's setup_model_and_optimizer: its OptimizerParamScheduler sets each group's lr and weight decay
        # (the config's times the group's wd_mult: 0 for a bias or a norm) at construction and after each step;
        # megatron-core's groups carry wd_mult alone — without the scheduler every group decays (watched in
        # suites/stack/test_adamw.py). Its learning rate: the recipe's schedule (constant without one); its decay the
        # spec's throughout
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, **lr_arguments(opt.lr, recipe.lr_schedule), start_wd=opt.weight_decay,
            end_wd=opt.weight_decay, wd_incr_steps=1, wd_incr_style="constant",
            use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=True)
        config.finalize_model_grads_func = finalize_model_grads  # Megatron-LM's training setup
        config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
        if ddp_config.overlap_grad_reduce:  # Megatron-LM's setup_model_and_optimizer, --align-grad-reduce
            syncs = [c.start_grad_sync for c in chunks]
            config.grad_sync_func = syncs if len(chunks) > 1 else syncs[0]
        return chunks

    def _dense_name_of(self, name: str) -> str:
        """A tied head's weight (the last stage's copy under pp) is the embedding's."""
        return "embedding.word_embeddings.weight" if self.spec.tie_embeddings and name == "output_layer.weight" \
            else name

    def activate(self) -> None:
        """Make this trainer's layout megatron-core's module-global parallel state (its schedules and stage
        tests read it at every step): where another layout's trainer of this process initialised it since (the
        bench keeps several between its rounds), initialise it again — collectively, as every rank of a case
        does. Optional for stacks; the bench calls it before timing a step."""
        from megatron.core import parallel_state as ps

        key = (self.layout.tp, self.layout.pp, self.vp)
        current = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                   ps.get_virtual_pipeline_model_parallel_world_size()) if ps.model_parallel_is_initialized() else None
        # another of the harness's Megatron adapters (its TP layers', its MoE layer's) may have initialised it since
        if _ACTIVE[0] != key or current != key or ps.get_expert_model_parallel_world_size() != 1:
            ps.destroy_model_parallel()
            ps.initialize_model_parallel(tensor_model_parallel_size=key[0], pipeline_model_parallel_size=key[1],
                                         virtual_pipeline_model_parallel_size=key[2], order="tp-cp-ep-pp-dp")
            _ACTIVE[0] = key

    def step(self, tokens, targets) -> float:
        with on_cpu():
            self.activate()
            return self._step(tokens, targets)

    def _step(self, tokens, targets) -> float:
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from harness.stack.inputs import IGNORE, replica_rows

        chunks, layout, recipe = self.trainer, self.layout, self.recipe
        m = (layout.num_microbatches if layout.pp > 1 else 1) * recipe.accumulation
        dp_rank = ps.get_data_parallel_rank()
        mine, theirs, rows = replica_rows(tokens, targets, layout.dp, dp_rank, m)
        if rows == 0:
            raise ValueError(f"the Megatron stack splits a replica's rows into {m} equal micro-batches; "
                             f"{len(mine)} rows do not split.")
        batches = [(mine[i * rows:(i + 1) * rows], theirs[i * rows:(i + 1) * rows]) for i in range(m)]
        positions = torch.arange(tokens.shape[1]).expand(rows, -1)

        def loss_func(loss_mask, output):  # pretrain_gpt's: (the masked sum, its token count, what it reports)
            loss = torch.sum(output.float().view(-1) * loss_mask.view(-1))
            num_tokens = loss_mask.sum().to(torch.int)
            return loss, num_tokens, {"lm loss": torch.stack([loss.detach().clone(), num_tokens.float()])}

        def forward_step(data_iterator, model):  # a padded target (IGNORE) is a 0 in the loss mask, as its datasets
            x, y = next(data_iterator)
            mask = (y != IGNORE).float()
            return model(x, positions, None, labels=y.clamp(min=0)), functools.partial(loss_func, mask)

        for chunk in chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        iterators = [iter(batches) for _ in chunks] if len(chunks) > 1 else iter(batches)
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iterators, model=chunks, num_microbatches=m,
            seq_length=tokens.shape[1], micro_batch_size=rows, forward_only=False)
        success, grad_norm, _ = self.optimizer.step()
        if not success:
            raise RuntimeError("megatron-core's optimizer skipped the step (found inf / NaN gradients).")
        self.scheduler.step(increment=1)  # Megatron-LM's train_step, after a successful update
        self.last_grad_norm = float(grad_norm) if recipe.max_grad_norm is not None else None
        last = losses and self.tp_rank == 0  # each replica's (sum, count), from its last stage's first TP rank
        loss_sum, count = summed([sum(float(d["lm loss"][i]) for d in losses) if last else 0.0 for i in (0, 1)])
        return loss_sum / count

    def _optimizers(self) -> list:
        """Megatron's optimizers under its ChainedOptimizer (or the one it returned)."""
        return getattr(self.optimizer, "chained_optimizers", [self.optimizer])

    def _contributions(self) -> dict:
        """{(name, tp rank): (dp rank, local parameter, [(flat start, flat stop, {state key: flat shard})])}
        of this rank — the optimizer's state where it lives (the whole tensor, or this dp rank's range of it under
        the distributed optimizer)."""
        from megatron.core import parallel_state as ps

        keys = self.recipe.optimizer.state_keys
        dp = ps.get_data_parallel_rank()
        out = {}
        for chunk in self.trainer:
            for p, name in _global_names(chunk).items():
                out[(name, self.tp_rank)] = (dp, p.detach().clone(), self._state_pieces(p, keys))
        return out

    def _state_pieces(self, p, keys) -> list:
        """[(flat start, flat stop, {state key: flat shard})] of ``p`` on this rank; bf16: its fp32 main param too,
        under "param"."""
        keys = (*keys, "param") if self.mixed else keys
        for opt in self._optimizers():
            if hasattr(opt, "model_param_group_index_map"):  # the distributed optimizer: this rank's range
                if p not in opt.model_param_group_index_map:
                    continue
                rng = opt._get_model_param_range_map(p)["param"]
                st = opt._get_main_param_and_optimizer_states(p)
                return [(rng.start, rng.end, {k: st[k].detach().clone().flatten() for k in keys if k in st})]
            main = _main_params(opt).get(id(p), p)  # Float16OptimizerWithFloat16Params: its fp32 copy of p
            st = opt.optimizer.state.get(main)
            if st is not None:
                st = {**st, "param": main}
                return [(0, p.numel(), {k: st[k].detach().clone().flatten() for k in keys if k in st})]
        return []

    def memory(self) -> dict:
        """Bytes of model state this rank holds between steps (each storage once): its chunks' parameters (and
        the buffer DDP lays them in), the gradient buffers (``grad_data``, fp32), the optimizer's state and fp32
        main params (the distributed optimizer's shards of them)."""
        from reference.zero.accounting import held_bytes, optimizer_state_tensors

        chunks = self.trainer
        buffers = [b for c in chunks for b in getattr(c, "buffers", []) + getattr(c, "expert_parallel_buffers", [])]
        kept = ("fp32_from_float16_groups", "shard_fp32_from_float16_groups")
        mains = [m for opt in self._optimizers() for attr in kept for group in getattr(opt, attr, []) for m in group]
        return {"params": held_bytes([p for c in chunks for p in c.parameters()] + [b.param_data for b in buffers]),
                "grads": held_bytes([b.grad_data for b in buffers]),
                "optimizer": held_bytes(mains + [t for opt in self._optimizers()
                                                 for t in optimizer_state_tensors(opt.optimizer)])}

    def dense_state(self) -> dict:
        from megatron.core import parallel_state as ps

        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, self._contributions())
        my_dp, shapes = ps.get_data_parallel_rank(), self.shapes
        spec, tp = self.spec, self.layout.tp
        params, states = {}, {}
        locals_, flat = {}, {}
        for held in everyone:
            for key, (dp, value, pieces) in held.items():
                if dp == my_dp or key not in locals_:  # this replica's parameters
                    locals_[key] = value
                for start, stop, st in pieces:
                    for k, shard in st.items():
                        flat.setdefault((key, k), torch.full((value.numel(),), float("nan")))[start:stop] = shard
        for (name, r), value in locals_.items():
            _scatter_dense(spec, name, tp, r, self.vocab_padded, value, params, shapes)
        for ((name, r), k), values in flat.items():
            _scatter_dense(spec, name, tp, r, self.vocab_padded, values.view(locals_[(name, r)].shape),
                           states.setdefault(k, {}), shapes)
        if self.mixed:  # the training state: the fp32 main params (the bf16 model is them rounded)
            params = states.pop("param")
        optimizer = {}
        for k, dense in states.items():
            for name, t in dense.items():
                optimizer.setdefault(name, {})[k] = t
        if spec.tie_embeddings:  # one parameter under both names (under pp the last stage's copy as it is), its
            params.setdefault("head.weight", params["embed.weight"])  # state once: the embedding's
            optimizer.pop("head.weight", None)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
