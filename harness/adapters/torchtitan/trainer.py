"""torchtitan's trainer under the stack contract (0.3.x; ``torchtitan_v02.py`` subclasses it for 0.2.x): its model
built from a config of the spec's sizes, parallelized by its own functions, the step of ``Trainer.train_step``,
the dense state, DCP save / load. ``torchtitan_stack.py`` says what it refuses and builds it; its docstring says
what the adapter chooses, and why."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.adapters.torchtitan.names import contract_name, torchtitan_name
from harness.adapters.torchtitan.state import _load, _save, _scalar, materialise
from harness.runtime.rank import rank_device, summed
from harness.stack.built import BuiltFromDense
from harness.stack.dense import full_tensors, gathered, tied
from reference.errors import Unsupported

SPMD_BACKEND = "partial_dtensor"


def model_config(spec, seq: int = 64):
    """torchtitan's ``Llama3Model.Config`` of the spec's sizes (rotate-half RoPE, the SDPA core, no init: the
    weights are loaded from the one-device model)."""
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.rope import CosSinRoPE
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    keep = {"weight": lambda t: t}  # the weights come from load_dense

    def norm():
        return RMSNorm.Config(normalized_shape=spec.hidden, eps=spec.norm_eps, param_init=keep)

    layers = [Llama3TransformerBlock.Config(
        attention_norm=norm(), ffn_norm=norm(),
        attention=make_gqa_config(dim=spec.hidden, n_heads=spec.heads, n_kv_heads=spec.kv, wqkv_param_init=keep,
                                  wo_param_init=keep, inner_attention=ScaledDotProductAttention.Config(),
                                  fuse_qkv=False, rope=CosSinRoPE.Config(dim=spec.hidden // spec.heads,
                                                                         max_seq_len=seq, theta=spec.rope_theta)),
        feed_forward=make_ffn_config(dim=spec.hidden, hidden_dim=spec.ffn, w1_param_init=keep, w2w3_param_init=keep))
        for _ in range(spec.layers)]
    return Llama3Model.Config(
        dim=spec.hidden, vocab_size=spec.vocab, norm=norm(), layers=layers, enable_weight_tying=spec.tie_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=spec.vocab, embedding_dim=spec.hidden, param_init=keep),
        lm_head=Linear.Config(in_features=spec.hidden, out_features=spec.vocab, param_init=keep))


SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble",
             "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
"""Our schedule names -> torchtitan's ``pipeline_parallel_schedule`` (torch's ``get_schedule_class`` names)."""
CHUNKED = ("interleaved", "interleaved-zb", "zbv", "dualpipev")
"""Two model chunks per pipeline rank (torchtitan places ZBV's and DualPipeV's as a V itself)."""


NO_DECAY = r"norm\.weight$|\.bias$"
"""The pattern a torchtitan user gives the parameters AdamW does not decay (its ``ParamGroupConfig``: first match
wins; its docstring's example names biases and norms) — ``OptimizerSpec.decay`` "matrices"."""


def param_groups(opt, parts) -> list:
    """torchtitan's ``ParamGroupConfig`` list for the spec's Adam / AdamW: one group of every parameter, or AdamW's
    rule "matrices" as its users set it — ``NO_DECAY``'s parameters at weight_decay 0 first, the rest decayed. The
    pattern must name exactly the vectors (the rule is by shape): else the case is not what torchtitan can be told."""
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    name = {"adam": "Adam", "adamw": "AdamW"}[opt.name]
    kwargs = {"lr": opt.lr, "betas": opt.betas, "eps": opt.eps, "weight_decay": opt.weight_decay}
    every = ParamGroupConfig(pattern=".*", optimizer_name=name, optimizer_kwargs=kwargs)
    if opt.name != "adamw" or opt.decay == "all":
        return [every]
    import re

    named = [(n, p) for part in parts for n, p in part.named_parameters()]
    off = sorted(n for n, p in named if bool(re.search(NO_DECAY, n)) != (p.dim() < 2))
    if off:
        raise Unsupported(f"torchtitan's no-decay pattern {NO_DECAY!r} does not name exactly the parameters of fewer "
                          f"than two dimensions here ({', '.join(off[:3])}): AdamW's rule 'matrices' is not set.")
    return [ParamGroupConfig(pattern=NO_DECAY, optimizer_name=name, optimizer_kwargs={**kwargs, "weight_decay": 0.0}),
            every]


class TorchtitanStackTrainer(BuiltFromDense):
    def __init__(self, spec, layout, recipe, cpu_offload: bool = False):
        """``cpu_offload``: its ``training.enable_cpu_offload`` (FSDP2's CPUOffloadPolicy: the sharded parameters, their
        gradients and the optimizer's step on the host)."""
        self.spec, self.layout, self.recipe, self.cpu_offload = spec, layout, recipe, cpu_offload

    def _parallelism(self):
        from torchtitan.config import ParallelismConfig

        layout = self.layout
        replicate = layout.dp if layout.zero == 0 else layout.replicate  # HSDP: dp_replicate x dp_shard
        return ParallelismConfig(
            data_parallel_replicate_degree=replicate,
            data_parallel_shard_degree=layout.dp // replicate, tensor_parallel_degree=layout.tp,
            enable_sequence_parallel=layout.sequence_parallel,
            fsdp_reshard_after_forward="never" if layout.zero == 2 else "default", spmd_backend=SPMD_BACKEND,
            expert_parallel_degree=layout.ep,
            pipeline_parallel_degree=layout.pp, pipeline_parallel_schedule=SCHEDULES[layout.schedule],
            pipeline_parallel_microbatch_size=1, module_fqns_per_model_part=self._interleaved_parts())

    def _interleaved_parts(self) -> list[list[str]] | None:
        """The schedules of two chunks per rank (``CHUNKED``): 2 pp model chunks of contiguous layers, the embedding
        in the first, the norm and the head in the last (torchtitan's explicit split, ``module_fqns_per_model_part``;
        its automatic one counts the embedding and the head as layers and needs a layer count that fits it). None:
        torchtitan's split."""
        if self.layout.schedule not in CHUNKED:
            return None
        from reference.stack.compose import stage_bounds

        chunks = 2 * self.layout.pp
        bounds = stage_bounds(self.spec.layers, chunks)
        parts = [[f"layers.{i}" for i in range(bounds[c], bounds[c + 1])] for c in range(chunks)]
        parts[0].insert(0, "tok_embeddings")
        parts[-1] += ["norm", "lm_head"]
        return parts

    def _model(self, parallelism):
        """(torchtitan's config of the spec with its sharding declared, its parallelize function). The sharding:
        what ``Llama3Model.Config.update_from_config`` does for a parallelism; that method itself imports
        torchtitan.trainer, which needs the data stack (torchdata, datasets)."""
        if self.spec.family == "moe":
            from harness.adapters.torchtitan.moe_stack import model

            return model(self.spec, parallelism)
        from torchtitan.models.llama3 import parallelize_llama
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        config = model_config(self.spec)
        if self.recipe.low_precision is not None:  # its float8 converter on the config, as its trainer applies it
            from harness.adapters.torchtitan.low_precision import emulated, recipe_converter

            conv, why = recipe_converter(self.recipe.low_precision, emulate=emulated())
            if why:
                raise Unsupported(why)
            conv.convert(config)
        set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
        return config, parallelize_llama

    def _titan_state(self, model) -> dict:
        """The one-device model's weights under torchtitan's names, float32 (its parameters' dtype)."""
        if self.spec.family == "moe":
            from harness.adapters.torchtitan.moe_stack import titan_state

            return titan_state(model)
        return {torchtitan_name(k): v.detach().clone().to(torch.float32) for k, v in model.state_dict().items()}

    def _dense_entries(self, name: str, value, state: dict):
        """(contract name, full tensor, its optimizer state) of torchtitan's parameter ``name``."""
        if self.spec.family == "moe":
            from harness.adapters.torchtitan.moe_stack import dense_entries

            yield from dense_entries(name, value, state)
            return
        yield contract_name(name), value, state

    def _build(self, model):
        """torchtitan's model of the spec, ``model``'s weights loaded, parallelized by ``parallelize_llama``
        (through ``pipeline_llm`` with pp > 1: its stage split, its schedule, each stage parallelized)."""
        from torchtitan.components.loss import CrossEntropyLoss
        from torchtitan.components.optimizer.optimizer import OptimizersContainer
        from torchtitan.config import CompileConfig, TrainingConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.activation_checkpoint import FullAC
        from torchtitan.models.llama3 import pipeline_llm

        layout, spec = self.layout, self.spec
        dist_utils.set_spmd_backend(SPMD_BACKEND)  # as Trainer.__init__ does
        parallelism = self._parallelism()
        self.dims = ParallelDims.from_config(parallelism, dist.get_world_size())
        self.dims.build_mesh()
        config, parallelize = self._model(parallelism)
        with torch.device("meta"):  # Trainer.__init__'s order: meta model, parallelize, to_empty, init_weights
            titan = config.build()
        self.loss_fn = CrossEntropyLoss.Config().build()
        # its per-block compile (apply_compile: after AC, before FSDP); the loss stays eager as the one device's
        from harness.stack.compiled_ops import backend  # inductor (a recorder while recompute is counted)

        compile_config = CompileConfig(enable=layout.compile, components=["model"], backend=backend())
        common = {"parallel_dims": self.dims, "parallelism": parallelism, "compile_config": compile_config,
                  "ac_config": FullAC.Config() if layout.checkpointing else None, "dump_folder": "/tmp",
                  "training": TrainingConfig(mixed_precision_param=spec.dtype, mixed_precision_reduce="float32",
                                             local_batch_size=layout.num_microbatches,
                                             enable_cpu_offload=self.cpu_offload)}
        if layout.pp > 1:
            self.schedule, parts, self.first, self.last = pipeline_llm(
                titan, **common, device=rank_device(), model_config=config, parallelize_fn=parallelize,
                loss_fn=self.loss_fn)
        else:
            self.schedule, parts, self.first, self.last = None, [parallelize(titan, **common)], True, True
        materialise(parts, self._titan_state(model))
        self.optimizers = OptimizersContainer.Config(param_groups=param_groups(self.recipe.optimizer, parts),
                                                     implementation="for-loop").build(model_parts=parts)
        self.lr_schedulers = None
        if self.recipe.lr_schedule is not None:  # its job's lr_scheduler section (harness/adapters/torchtitan/lr.py)
            from .lr import config

            cfg, steps = config(self.recipe.lr_schedule)
            self.lr_schedulers = cfg.build(optimizers=self.optimizers, training_steps=steps)
        self.last_grad_norm = None
        return parts

    def step(self, tokens, targets) -> float:
        """``Trainer.train_step``: the rank's rows of the global batch, the loss summed and divided by the
        global token count, forward and backward per accumulation micro-step (through the pipeline schedule
        with pp > 1, one row per micro-batch), torchtitan's clip_grad_norm_, the optimizers' step."""
        from torchtitan.components.loss import IGNORE_INDEX
        from torchtitan.distributed import utils as dist_utils

        from harness.stack.inputs import replica_rows

        parts = self.trainer  # built (load_dense, or the spec's seed 0)
        dims, recipe, layout = self.dims, self.recipe, self.layout
        k = recipe.accumulation
        r = dims.get_mesh("batch").get_local_rank() if dims.dp_enabled else 0
        mine, theirs, rows = replica_rows(tokens, targets, layout.dp, r, k)
        if layout.pp > 1 and rows != layout.num_microbatches:
            raise ValueError(f"the torchtitan stack pipelines micro-batches of one row (its schedule is built for "
                             f"{layout.num_microbatches}); a replica's accumulation step has {rows}: pass dp x "
                             "microbatches x accumulation rows.")
        # Trainer.train_step's: this replica's counted targets (not IGNORE_INDEX), summed over the batch mesh
        global_tokens = (theirs != IGNORE_INDEX).sum()
        if dims.dp_enabled:
            global_tokens = self._sum_over(global_tokens, dims.get_mesh("batch"))
        self.optimizers.zero_grad()
        loss_sum = 0.0
        for a in range(k):
            part = slice(a * rows, (a + 1) * rows)
            loss_sum += self._forward_backward(parts, mine[part], theirs[part], global_tokens)
        if recipe.max_grad_norm is not None:
            norm = dist_utils.clip_grad_norm_([p for m in parts for p in m.parameters()], recipe.max_grad_norm,
                                              recipe.norm_type, foreach=True, pp_mesh=dims.get_optional_mesh("pp"),
                                              ep_enabled=dims.ep_enabled)
            self.last_grad_norm = _scalar(norm)
        self.optimizers.step()
        if self.lr_schedulers is not None:  # Trainer.train_step's order: after the optimizers
            self.lr_schedulers.step()
        for axis in ("pp", "batch"):  # the last stage's sums, over every replica
            mesh = dims.get_optional_mesh(axis)
            if mesh is not None:
                [loss_sum] = summed([loss_sum], mesh.get_group())
        return float(loss_sum)

    @staticmethod
    def _sum_over(count, mesh):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum_tensor(count, mesh)

    def traced_modules(self) -> dict:
        """{one-device module name: this rank's module} (``harness.localise``): the modules whose parameters are one
        one-device module's exactly (a grouped-experts module holds many: none)."""
        from harness.localise.names import modules_by_parameters

        names = {}
        for part in self.trainer:
            for n, p in part.named_parameters():
                entries = list(self._dense_entries(n, p, {}))
                names[id(p)] = entries[0][0] if len(entries) == 1 else None
        return modules_by_parameters(self.spec, self.trainer, lambda p: names.get(id(p)))

    def _forward_backward(self, parts, tokens, targets, global_tokens) -> float:
        """One accumulation micro-step (``Trainer.forward_backward_step``); the loss this rank holds: its sum /
        the global token count (0 on a pipeline rank without the last stage)."""
        if self.schedule is None:
            loss, _ = self.loss_fn(parts[0](tokens), targets, global_tokens)
            loss.backward()
            return _scalar(loss)
        # torchtitan 0.3's trainer calls step(arg_mbs=, kwarg_mbs=, target_mbs=), a torch-nightly signature; torch
        # 2.13's schedules take the whole batch and split it themselves (one row per micro-batch here): the same
        # schedule and stages (torchtitan's), called in the form this torch has
        losses = [] if self.last else None
        args = (tokens,) if self.first else ()
        self.schedule.step(*args, target=targets if self.last else None, losses=losses,
                           loss_kwargs={"global_valid_tokens": global_tokens}, return_outputs=False)
        return sum(_scalar(v) for v in losses) if self.last else 0.0

    resumes_lr_schedule = True
    """``save`` / ``load`` carry its ``LRSchedulersContainer`` (its position), as its ``CheckpointManager`` does."""

    def save(self, directory) -> None:
        _save(self, directory)

    def load(self, directory) -> None:
        _load(self, directory)

    def memory(self) -> dict:
        """Bytes of model state this rank holds between steps (each storage once): its shards of the parameters
        (a DTensor's local tensor), their gradients, the optimizers' state."""
        from reference.zero.accounting import held_bytes, optimizer_state_tensors

        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t

        params = [p for part in self.trainer for p in part.parameters()]
        state = [t for opt in self.optimizers.optimizers for t in optimizer_state_tensors(opt)]
        return {"params": held_bytes(local(p) for p in params),
                "grads": held_bytes(local(p.grad) for p in params if p.grad is not None),
                "optimizer": held_bytes(local(t) for t in state)}

    def dense_state(self) -> dict:
        keys = self.recipe.optimizer.state_keys
        opt_state = {}
        for opt in self.optimizers.optimizers:
            opt_state.update(opt.state)
        named = [(n, p) for part in self.trainer for n, p in part.named_parameters()]
        states = [opt_state.get(p, {}) for _, p in named]
        # keyed by position, not name: two model parts of a rank may name a parameter alike
        full = full_tensors({i: {"value": p.detach(), "state": {key: st[key] for key in keys if key in st}}
                             for i, ((_, p), st) in enumerate(zip(named, states, strict=True))})
        mine = {}
        for i, (name, _) in enumerate(named):
            for dense, value, state in self._dense_entries(name, full[i]["value"], full[i]["state"]):
                mine[dense] = (value, state)
        every = gathered(mine)  # pipeline ranks hold different layers: every rank's (harness.stack.dense)
        params = {name: value for name, (value, _) in every.items()}
        optimizer = {name: state for name, (_, state) in every.items()}
        if self.spec.tie_embeddings:
            tied(params, optimizer)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}
