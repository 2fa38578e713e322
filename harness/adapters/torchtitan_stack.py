"""torchtitan (0.3.x) under the stack contract, through its own code: its ``Llama3Model`` built from a config
of the spec's sizes, its ``parallelize_llama`` (TP with its sequence and loss parallelism, activation
checkpointing, FSDP2 or replicate over dp), its ``CrossEntropyLoss`` normalised by the global token count
as its trainer does, its ``clip_grad_norm_``, its ``OptimizersContainer`` — and DCP for save / load. The
step mirrors ``torchtitan.trainer.Trainer.train_step`` (the trainer itself needs a data loader, a tokenizer
and a job config; nothing of the training arithmetic is in them).

What the adapter chooses, and why:
- the rotary embedding is torchtitan's ``CosSinRoPE`` (rotate-half: the contract's Llama; its default
  ``ComplexRoPE`` pairs interleaved dimensions — the same function after a permutation of q / k rows that
  HF's converters apply; the rotate-half form needs none);
- the attention core is its ``ScaledDotProductAttention`` (its language-model backends, flex and varlen,
  need torch.compile or CUDA): the model is called without document masks, plain causal attention;
- float32, or bf16 as torchtitan trains it (``mixed_precision_param`` bf16, ``mixed_precision_reduce`` fp32:
  FSDP2's MixedPrecisionPolicy, which parallelize_llama installs on every layout — fp32 parameters are the
  masters); torchtitan computes the rotary embedding in float32 whatever the parameters' dtype
  (``CosSinRoPE.apply_rotary_emb`` casts q, k and the cache): a float64 spec is unsupported;
- Adam (torchtitan's optimizers are Adam, AdamW and Muon: no SGD), for-loop implementation (fused is CUDA);
- ZeRO 0 is its ``replicate`` over dp (data_parallel_replicate_degree), 2 FSDP2 without resharding after
  forward (``fsdp_reshard_after_forward="never"``), 3 FSDP2 (its default); ZeRO 1 it does not do.

Names: torchtitan's ``tok_embeddings``, ``layers.<i>.attention.qkv_linear.w{q,k,v}``, ``attention.wo``,
``feed_forward.w1`` (gate) / ``w3`` (up) / ``w2`` (down), ``attention_norm``, ``ffn_norm``, ``norm``,
``lm_head`` <-> the contract's (``torchtitan_name``, ``contract_name``). ``save`` / ``load``: what torchtitan's
``CheckpointManager`` saves ("model": its ``ModelWrapper``, "optimizer": its ``OptimizersContainer``, both
FQN-keyed) through DCP, so any layout reads what any other wrote."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..contracts import Unsupported
from .dense_built import BuiltFromDense
from .torchtitan_names import contract_name, torchtitan_name

SPMD_BACKEND = "partial_dtensor"

def _unsupported(spec, layout, recipe) -> str | None:
    if spec.family == "moe":
        from .torchtitan_moe_stack import unsupported

        why = unsupported(spec, layout)
        if why:
            return why
    elif spec.family != "llama":
        return (f"the torchtitan stack here trains its Llama3 (the llama family) and its Qwen3 MoE (the moe family), "
                f"not the {spec.family} family.")
    elif spec.dtype not in ("float32", "bfloat16"):
        return ("torchtitan computes the rotary embedding in float32 whatever the parameters' dtype "
                f"(CosSinRoPE.apply_rotary_emb casts q, k and its cache): it trains float32, or bf16 through FSDP2's "
                f"mixed precision; a {spec.dtype} spec is not what it computes.")
    if spec.extra or layout.extra:
        return f"the torchtitan stack does not know {', '.join(sorted({**spec.extra, **layout.extra}))}."
    if recipe.optimizer.name != "adam":
        return (f"torchtitan's optimizers are Adam, AdamW and Muon; {recipe.optimizer.name} is not one of them.")
    if layout.dp > 1 and layout.zero == 1:
        return "torchtitan replicates (ZeRO 0) or shards with FSDP2 (ZeRO 2 / 3) over dp; ZeRO 1 it does not do."
    if layout.cp > 1:
        return "the torchtitan stack here has no context parallelism yet."
    if layout.ep > 1 and spec.family != "moe":
        return f"ep = {layout.ep} splits experts: the {spec.family} family has none."
    if spec.tie_embeddings and layout.pp > 1:
        return "torchtitan does not tie the embedding to the LM head under pipeline parallelism (its own refusal)."
    if recipe.loss_scale is not None:
        return "the torchtitan stack here has no loss scaler (float32 needs none)."
    return None


class TorchtitanStack:
    description = "torchtitan: its Llama3Model + parallelize_llama (TP/SP/loss parallel, FSDP2 / replicate, AC)"

    def build(self, spec, layout, recipe, group=None):
        why = _unsupported(spec, layout, recipe)
        if why:
            raise Unsupported(why)
        if layout.schedule == "interleaved" and 2 * layout.pp > spec.layers:
            raise ValueError(f"the interleaved schedule's 2 x pp = {2 * layout.pp} model chunks need as many layers; "
                             f"the model has {spec.layers}.")
        if layout.pp > 1 and layout.schedule != "gpipe" and layout.num_microbatches < layout.pp:
            raise ValueError(f"torch's {SCHEDULES[layout.schedule]} schedule (torchtitan's pipeline) needs at least as "
                             f"many micro-batches as stages: {layout.num_microbatches} < pp = {layout.pp}.")
        if spec.heads % layout.tp or spec.kv % layout.tp:
            raise ValueError(f"tp ({layout.tp}) must divide the attention heads ({spec.heads}) and the KV heads "
                             f"({spec.kv}): torchtitan splits both, it does not replicate KV heads.")
        if spec.family == "moe" and spec.experts % layout.ep:
            raise ValueError(f"the {spec.experts} experts do not split evenly over ep = {layout.ep} (torchtitan shards "
                             "its grouped experts' first dimension over the EP mesh).")
        from .torchtitan_import import import_torchtitan

        import_torchtitan()
        return TorchtitanStackTrainer(spec, layout, recipe)


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


SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}


class TorchtitanStackTrainer(BuiltFromDense):
    def __init__(self, spec, layout, recipe):
        self.spec, self.layout, self.recipe = spec, layout, recipe

    def _parallelism(self):
        from torchtitan.config import ParallelismConfig

        layout = self.layout
        replicate = layout.zero == 0
        return ParallelismConfig(
            data_parallel_replicate_degree=layout.dp if replicate else 1,
            data_parallel_shard_degree=1 if replicate else layout.dp, tensor_parallel_degree=layout.tp,
            enable_sequence_parallel=layout.sequence_parallel,
            fsdp_reshard_after_forward="never" if layout.zero == 2 else "default", spmd_backend=SPMD_BACKEND,
            expert_parallel_degree=layout.ep,
            pipeline_parallel_degree=layout.pp, pipeline_parallel_schedule=SCHEDULES[layout.schedule],
            pipeline_parallel_microbatch_size=1, module_fqns_per_model_part=self._interleaved_parts())

    def _interleaved_parts(self) -> list[list[str]] | None:
        """Interleaved 1F1B: 2 pp model chunks of contiguous layers, the embedding in the first, the norm and the
        head in the last (torchtitan's explicit split, ``module_fqns_per_model_part``; its automatic one counts
        the embedding and the head as layers and needs a layer count that fits it). None: torchtitan's split."""
        if self.layout.schedule != "interleaved":
            return None
        from reference.compose import stage_bounds

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
            from .torchtitan_moe_stack import model

            return model(self.spec, parallelism)
        from torchtitan.models.llama3 import parallelize_llama
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        config = model_config(self.spec)
        set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
        return config, parallelize_llama

    def _titan_state(self, model) -> dict:
        """The one-device model's weights under torchtitan's names, float32 (its parameters' dtype)."""
        if self.spec.family == "moe":
            from .torchtitan_moe_stack import titan_state

            return titan_state(model)
        return {torchtitan_name(k): v.detach().clone().to(torch.float32) for k, v in model.state_dict().items()}

    def _dense_entries(self, name: str, value, state: dict):
        """(contract name, full tensor, its optimizer state) of torchtitan's parameter ``name``."""
        if self.spec.family == "moe":
            from .torchtitan_moe_stack import dense_entries

            yield from dense_entries(name, value, state)
            return
        yield contract_name(name), value, state

    def _build(self, model):
        """torchtitan's model of the spec, ``model``'s weights loaded, parallelized by ``parallelize_llama``
        (through ``pipeline_llm`` with pp > 1: its stage split, its schedule, each stage parallelized)."""
        from torchtitan.components.loss import CrossEntropyLoss
        from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
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
        common = {"parallel_dims": self.dims, "parallelism": parallelism, "compile_config": CompileConfig(enable=False),
                  "ac_config": FullAC.Config() if layout.checkpointing else None, "dump_folder": "/tmp",
                  "training": TrainingConfig(mixed_precision_param=spec.dtype, mixed_precision_reduce="float32",
                                             local_batch_size=layout.num_microbatches)}
        if layout.pp > 1:
            self.schedule, parts, self.first, self.last = pipeline_llm(
                titan, **common, device=torch.device("cpu"), model_config=config, parallelize_fn=parallelize,
                loss_fn=self.loss_fn)
        else:
            self.schedule, parts, self.first, self.last = None, [parallelize(titan, **common)], True, True
        state = self._titan_state(model)
        for part in parts:
            part.to_empty(device="cpu")
            with torch.no_grad():
                part.init_weights(buffer_device=None)  # the rotary cache; a tied embedding re-tied to the head
                _load_full(part, state)  # then the one-device weights, where a checkpoint load would put them
        if dist.get_backend() == "gloo":  # gloo has no PREMUL_SUM, which torchtitan's divide factor 1 makes FSDP2 use
            from torch.distributed.fsdp import FSDPModule

            for module in (m for part in parts for m in part.modules()):
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)  # the same sum, the factor (1) applied apart
        opt = self.recipe.optimizer
        kwargs = {"lr": opt.lr, "betas": opt.betas, "eps": opt.eps, "weight_decay": 0.0}
        self.optimizers = OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="Adam", optimizer_kwargs=kwargs)],
            implementation="for-loop").build(model_parts=parts)
        self.last_grad_norm = None
        return parts

    def step(self, tokens, targets) -> float:
        """``Trainer.train_step``: the rank's rows of the global batch, the loss summed and divided by the
        global token count, forward and backward per accumulation micro-step (through the pipeline schedule
        with pp > 1, one row per micro-batch), torchtitan's clip_grad_norm_, the optimizers' step."""
        from torchtitan.components.loss import IGNORE_INDEX
        from torchtitan.distributed import utils as dist_utils

        from ..stack.inputs import replica_rows

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
            global_tokens = dist_utils.dist_sum_tensor(global_tokens, dims.get_mesh("batch"))
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
        total = torch.tensor([loss_sum], dtype=torch.float64)
        for axis in ("pp", "batch"):  # the last stage's sums, over every replica
            mesh = dims.get_optional_mesh(axis)
            if mesh is not None:
                dist.all_reduce(total, group=mesh.get_group())
        return float(total)

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
        mine = {}
        for name, p in ((n, p) for part in self.trainer for n, p in part.named_parameters()):
            st = opt_state.get(p, {})
            for dense, value, state in self._dense_entries(name, _full(p), {key: _full(st[key]) for key in keys
                                                                              if key in st}):
                mine[dense] = (value, state)
        everyone = [None] * dist.get_world_size()  # pipeline ranks hold different layers: every rank's, merged
        dist.all_gather_object(everyone, mine)
        params, optimizer = {}, {}
        for held in everyone:
            for name, (value, state) in held.items():
                params.setdefault(name, value)
                optimizer.setdefault(name, state)
        if self.spec.tie_embeddings:  # one parameter (named once): under both names, its state once (the
            for a, b in (("embed.weight", "head.weight"), ("head.weight", "embed.weight")):  # embedding's)
                if a not in params:  # two parameters where the tie broke: each reported as it is
                    params[a] = params[b]
            if "embed.weight" not in optimizer:
                optimizer["embed.weight"] = optimizer.pop("head.weight")
            elif params["embed.weight"] is params["head.weight"]:
                optimizer.pop("head.weight", None)
        return {"params": params, "optimizer": optimizer, "grad_norm": self.last_grad_norm}


def _scalar(t) -> float:
    return float(_full(t))


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def _save(trainer, directory) -> None:
    """torchtitan's checkpoint contents (``CheckpointManager``'s "model" and "optimizer": its ``ModelWrapper``
    and ``OptimizersContainer`` state dicts, FQN-keyed) through DCP — any layout reads it."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper

    dcp.save({"model": ModelWrapper(trainer.trainer), "optimizer": trainer.optimizers},
             checkpoint_id=str(directory))


def _load(trainer, directory) -> None:
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper

    dcp.load({"model": ModelWrapper(trainer.trainer), "optimizer": trainer.optimizers}, checkpoint_id=str(directory))


def _load_full(part, state: dict) -> None:
    """Each parameter of ``part`` (a DTensor shard, or a whole tensor), and each buffer ``state`` names, set to
    its one-device value: the full tensor replicated on the parameter's mesh, redistributed to its placements
    (torch 2.13's full-state-dict load, ``set_model_state_dict``, cannot place FSDP x TP's _StridedShard:
    distribute_tensor asserts)."""
    from torch.distributed.tensor import DTensor, Replicate

    params = ((name, p, True) for name, p in part.named_parameters())
    buffers = ((name, b, False) for name, b in part.named_buffers())  # those ``state`` names (a selection bias)
    for name, p, required in (*params, *buffers):
        key = name.replace("_checkpoint_wrapped_module.", "")
        if not required and key not in state:
            continue
        full = state[key]
        if isinstance(p, DTensor):
            whole = DTensor.from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
            p.to_local().copy_(whole.redistribute(p.device_mesh, p.placements).to_local())
        else:
            p.copy_(full)
