"""megatron-core (0.16) under the stack contract, through its own code: ``GPTModel`` with the local layer spec
(no TransformerEngine) for both families — the Llama (RMSNorm, SwiGLU, rotary, grouped-query attention, no
biases) and the GPT (LayerNorm, GELU, biases, no position embedding) through its ``TransformerConfig`` —, its
tensor and sequence parallelism, its pipeline schedules (``get_forward_backward_func``: 1F1B, interleaved
1F1B), its ``DistributedDataParallel`` (ZeRO 0) and distributed optimizer (ZeRO 1), ``finalize_model_grads``
(the DP reduction, the sequence-parallel norms' and the tied embedding's all-reduces), full activation
recomputation, and its optimizer (``get_megatron_optimizer``: torch's SGD / AdamW behind Megatron's
clipping by the global 2-norm). The step is Megatron-LM's ``train_step``: zero the grad buffers, one
``forward_backward_func`` over every micro-batch of the step (pipeline micro-batches x accumulation), the
loss function of ``pretrain_gpt`` (the sum over the micro-batch's loss mask, with its token count) under
``calculate_per_token_loss`` — Megatron-LM's ``--calculate-per-token-loss``, its option for the mean over the
global batch's counted tokens: ``finalize_model_grads`` divides the summed gradients by the count summed over
dp x cp. Its default instead divides each micro-batch's sum by that micro-batch's count and averages the
micro-batches and the replicas — another loss on a padded batch (docs/guides/stacks.md) —, then
``optimizer.step()`` (its grad norm before clipping).

On a CPU, ``megatron_cpu.on_cpu()`` redirects the CUDA device megatron-core writes into its code to the CPU
(what and why: that module); on a CUDA machine Megatron runs as it is.

What the adapter chooses, and why:
- float32, or bf16 with fp32 main params as Megatron-LM sets it up (``Float16Module`` over each chunk — the
  local spec's torch norms are built fp32 otherwise —, ``bf16`` in its Transformer and Optimizer configs,
  gradients accumulated and reduced in fp32; its clipping asserts float32 gradients: the main grads);
- the vocabulary padded to a multiple of tp with zero rows (Megatron-LM's ``_vocab_size_with_padding`` with
  ``make_vocab_size_divisible_by`` 1): the padding's logits then enter its cross-entropy's softmax (the tensor-
  parallel suite's finding) — the suite's spec has a vocabulary every tp divides, a watch the other;
- 5 layers over pp stages: ``num_layers_in_first_pipeline_stage`` takes the remainder (Megatron's uneven
  split); the interleaved schedule splits evenly (its own rule);
- ranks ``order="tp-cp-ep-pp-dp"``: the contract's placement (Megatron's default puts pp outermost).

Names: ``embedding.word_embeddings``, ``decoder.layers.<i>.{input_layernorm, self_attention.linear_qkv,
self_attention.linear_proj, pre_mlp_layernorm, mlp.linear_fc1, mlp.linear_fc2}``, ``decoder.final_layernorm``,
``output_layer`` — ``linear_qkv`` holds, per query group, its query heads, then its key and its value head;
``linear_fc1`` of the Llama this rank's gate rows, then its up rows (``_pieces``)."""

from __future__ import annotations

import functools
import re

import torch
import torch.distributed as dist

from harness.adapters.megatron.cpu import on_cpu
from harness.adapters.megatron.tensor_parallel import _padded
from harness.contracts import Unsupported
from harness.stack.built import BuiltFromDense
from harness.stack.supports import Rule, Supports


def _chunks(spec, layout) -> int:
    return 2 * layout.pp if layout.schedule == "interleaved" and layout.pp > 1 else layout.pp


SUPPORTS = Supports("the Megatron stack", unsupported=(
    Rule(lambda s, lay, r: s.family not in ("gpt", "llama"),
         lambda s, lay, r: f"the Megatron stack here trains GPTModel as the gpt and llama families, not the {s.family} "
                           "family."),
    Rule(lambda s, lay, r: s.dtype not in ("float32", "bfloat16"),
         lambda s, lay, r: "megatron-core clips float32 gradients (clip_grads asserts 'torch.cuda.FloatTensor'): it "
                           f"trains float32, or bf16 with fp32 main params; not {s.dtype} here (fp16's loss scaler is "
                           "not driven)."),
    Rule(lambda s, lay, r: lay.sequence_parallel,
         "megatron-core's local layer spec (torch norms, WrappedTorchNorm) refuses sequence parallelism (its own "
         "assertion); it needs TransformerEngine's or Apex's norms."),
    Rule(lambda s, lay, r: bool(s.dropout),
         "the Megatron stack here trains without dropout (its masks come from its own CUDA RNG tracker)."),
    Rule(lambda s, lay, r: lay.cp > 1 or lay.ep > 1,
         "the Megatron stack here has no context or expert parallelism yet."),
    Rule(lambda s, lay, r: lay.zero > 1,
         "Megatron's distributed optimizer shards optimizer state and fp32 master weights over dp, its gradients "
         "reduce-scattered into a whole buffer (ZeRO 1); ZeRO 2 / 3 is megatron_fsdp, not driven here."),
    Rule(lambda s, lay, r: lay.zero == 1 and r.optimizer.name != "adam",
         "megatron-core's distributed optimizer (ZeRO 1) takes Adam only (its own assertion)."),
    Rule(lambda s, lay, r: lay.pp > 1 and lay.schedule == "gpipe",
         "megatron-core's pipeline schedules are 1F1B and interleaved 1F1B; it has no GPipe."),
    Rule(lambda s, lay, r: r.max_grad_norm is not None and r.norm_type != 2.0,
         lambda s, lay, r: f"megatron-core's optimizer clips the global 2-norm (clip_grad), not the {r.norm_type} "
                           "norm."),
    Rule(lambda s, lay, r: r.loss_scale is not None,
         "the Megatron stack here has no loss scaler (float32 and bf16 need none)."),
), refused=(
    Rule(lambda s, lay, r: s.heads % lay.tp or s.kv % lay.tp,
         lambda s, lay, r: f"tp ({lay.tp}) must divide the attention heads ({s.heads}) and the KV heads ({s.kv}): "
                           "megatron-core splits query groups, it does not replicate them."),
    Rule(lambda s, lay, r: s.ffn % lay.tp,
         lambda s, lay, r: f"tp ({lay.tp}) must divide the feed-forward size ({s.ffn}) for megatron-core."),
    Rule(lambda s, lay, r: lay.schedule == "interleaved" and lay.pp > 1 and s.layers % _chunks(s, lay),
         lambda s, lay, r: f"megatron-core's interleaved schedule splits the {s.layers} layers evenly over its 2 x pp "
                           f"= {_chunks(s, lay)} model chunks."),
    Rule(lambda s, lay, r: lay.schedule == "interleaved" and lay.pp > 1 and lay.num_microbatches % lay.pp,
         lambda s, lay, r: f"megatron-core's interleaved schedule needs micro-batches ({lay.num_microbatches}) "
                           f"divisible by pp ({lay.pp})."),
    Rule(lambda s, lay, r: not (lay.schedule == "interleaved" and lay.pp > 1) and s.layers < lay.pp,
         lambda s, lay, r: f"pp ({lay.pp}) cannot exceed the number of layers ({s.layers})."),
))


class MegatronStack:
    description = "megatron-core: GPTModel (local spec) + its TP, 1F1B / interleaved, DDP / distributed optimizer"

    def build(self, spec, layout, recipe, group=None):
        if group is not None and group is not dist.group.WORLD and dist.get_world_size(group) != dist.get_world_size():
            raise Unsupported("megatron-core lays its parallel groups over the whole world (parallel_state).")
        SUPPORTS.check(spec, layout, recipe)
        import megatron.core  # noqa: F401 - the package under test, importable

        return MegatronStackTrainer(spec, layout, recipe, self.ddp_options)

    ddp_options: dict = {}
    """``DistributedDataParallelConfig`` fields an option sets (Megatron-LM's arguments)."""


class OverlapGradReduce(MegatronStack):
    """Megatron-LM's ``--overlap-grad-reduce`` (with its default ``--align-grad-reduce``): each bucket's reduction
    starts in backward as its gradients are ready (``grad_sync_func``: the chunks' ``start_grad_sync``), buckets of
    1,000 parameters so that this small model has many; with the distributed optimizer its reduce-scatters."""

    description = "megatron-core with Megatron-LM's --overlap-grad-reduce (buckets of 1,000 parameters)"
    ddp_options = {"overlap_grad_reduce": True, "bucket_size": 1000}


def _pieces(spec, name: str, tp: int, r: int, vocab_padded: int):
    """Megatron parameter ``name`` (global layer numbers) on tensor-parallel rank ``r``: (dim, [(dense name or
    None for zero padding, start, stop)]) — its local tensor is those slices of the dense tensors, concatenated
    along ``dim``."""
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    what = name.rsplit(".", 1)[-1]
    if m is None:
        if name.startswith("decoder.final_layernorm"):
            return 0, [(f"ln_f.{what}", 0, spec.hidden)]
        dense = "embed.weight" if name.startswith("embedding") else "head.weight"
        rows = vocab_padded // tp
        start, stop = r * rows, (r + 1) * rows
        return 0, [(dense, start, min(stop, spec.vocab))] + ([(None, spec.vocab, stop)] if stop > spec.vocab else [])
    block, part = f"blocks.{m.group(1)}", m.group(2)
    llama = spec.family == "llama"
    if part in ("input_layernorm", "pre_mlp_layernorm"):
        norm = {"input_layernorm": "attn_norm" if llama else "ln1", "pre_mlp_layernorm": "mlp_norm" if llama else "ln2"}
        return 0, [(f"{block}.{norm[part]}.{what}", 0, spec.hidden)]
    if part == "self_attention.linear_qkv":
        d, groups = spec.hidden // spec.heads, spec.kv
        per = spec.heads // groups
        out = []
        for g in range(r * groups // tp, (r + 1) * groups // tp):
            out += [(f"{block}.attn.q.{what}", g * per * d, (g + 1) * per * d),
                    (f"{block}.attn.k.{what}", g * d, (g + 1) * d), (f"{block}.attn.v.{what}", g * d, (g + 1) * d)]
        return 0, out
    h, f = spec.hidden // tp, spec.ffn // tp
    if part == "self_attention.linear_proj":
        return (1, [(f"{block}.attn.o.weight", r * h, (r + 1) * h)]) if what == "weight" else \
            (0, [(f"{block}.attn.o.bias", 0, spec.hidden)])
    if part == "mlp.linear_fc1":
        if llama:
            return 0, [(f"{block}.mlp.gate.weight", r * f, (r + 1) * f), (f"{block}.mlp.up.weight", r * f, (r + 1) * f)]
        return 0, [(f"{block}.fc1.{what}", r * f, (r + 1) * f)]
    if part == "mlp.linear_fc2":
        down = f"{block}.mlp.down.weight" if llama else f"{block}.fc2.{what}"
        return (1, [(down, r * f, (r + 1) * f)]) if what == "weight" else (0, [(down, 0, spec.hidden)])
    raise KeyError(f"megatron-core parameter {name!r} has no one-device counterpart here.")


def _local(spec, name, tp, r, vocab_padded, dense: dict) -> torch.Tensor:
    dim, pieces = _pieces(spec, name, tp, r, vocab_padded)
    parts = []
    for src, start, stop in pieces:
        if src is None:
            shape = list(dense["embed.weight"].shape)
            shape[dim] = stop - start
            parts.append(torch.zeros(shape, dtype=dense["embed.weight"].dtype))
        else:
            parts.append(dense[src].narrow(dim, start, stop - start))
    return torch.cat(parts, dim)


def _scatter_dense(spec, name, tp, r, vocab_padded, local: torch.Tensor, into: dict, shapes: dict) -> None:
    """The inverse of ``_local``: ``local`` (rank ``r``'s tensor of ``name``) written into the dense tensors."""
    dim, pieces = _pieces(spec, name, tp, r, vocab_padded)
    at = 0
    for src, start, stop in pieces:
        if src is not None:
            if src not in into:
                into[src] = torch.full(shapes[src], float("nan"), dtype=local.dtype)
            into[src].narrow(dim, start, stop - start).copy_(local.narrow(dim, at, stop - start))
        at += stop - start


_ACTIVE: list = [None]
"""The (tp, pp, vp) megatron-core's parallel state was last initialised with by this adapter (None: not by it)."""


def _main_params(opt) -> dict:
    """{id(bf16 model param): its fp32 main param} of a Float16OptimizerWithFloat16Params (else empty)."""
    pairs = zip(getattr(opt, "float16_groups", []), getattr(opt, "fp32_from_float16_groups", []), strict=True)
    return {id(p): main for low, high in pairs for p, main in zip(low, high, strict=True)}


def _global_names(chunk) -> dict:
    """{parameter: name with global layer numbers} of one model chunk (its wrappers' ``module.`` dropped)."""
    inner = chunk
    while hasattr(inner, "module"):  # DDP's, and bf16's Float16Module's
        inner = inner.module
    offset = inner.decoder.layers[0].layer_number - 1 if len(inner.decoder.layers) else 0
    names = {}
    for name, p in inner.named_parameters():
        m = re.match(r"decoder\.layers\.(\d+)\.", name)
        names[p] = f"decoder.layers.{int(m.group(1)) + offset}.{name[m.end():]}" if m else name
    return names


class MegatronStackTrainer(BuiltFromDense):
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
        kwargs = {"optimizer": opt.name, "lr": opt.lr, "weight_decay": 0.0, "params_dtype": self.dtype,
                  "bf16": self.mixed,
                  "clip_grad": recipe.max_grad_norm or 0.0, "use_distributed_optimizer": layout.zero == 1}
        kwargs |= {"sgd_momentum": opt.momentum} if opt.name == "sgd" else \
            {"adam_beta1": opt.betas[0], "adam_beta2": opt.betas[1], "adam_eps": opt.eps}
        self.optimizer = get_megatron_optimizer(OptimizerConfig(**kwargs), chunks)
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
        self.last_grad_norm = float(grad_norm) if recipe.max_grad_norm is not None else None
        last = losses and self.tp_rank == 0  # each replica's (sum, count), from its last stage's first TP rank
        total = torch.tensor([sum(float(d["lm loss"][i]) for d in losses) if last else 0.0 for i in (0, 1)],
                             dtype=torch.float64)
        dist.all_reduce(total)
        return float(total[0] / total[1])

    def _sharded(self, is_loading: bool) -> dict:
        """Megatron-LM's checkpoint contents (``generate_state_dict``): each model chunk's and the optimizer's
        sharded state dicts (global ShardedTensors: any layout reads what any other wrote; the distributed
        optimizer's in its ``fully_reshardable`` form)."""
        chunks = self.trainer
        model = {"model": chunks[0].sharded_state_dict()} if len(chunks) == 1 else \
            {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}
        flat = {k: v for d in model.values() for k, v in d.items()}
        metadata = {"distrib_optim_sharding_type": "fully_reshardable"}
        return model | {"optimizer": self.optimizer.sharded_state_dict(flat, is_loading=is_loading,
                                                                        metadata=metadata)}

    def save(self, directory) -> None:
        import importlib.util
        import multiprocessing
        import queue

        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        if importlib.util.find_spec("psutil") is None:  # its finding: without psutil the save never returns
            raise Unsupported("megatron-core's checkpoint writer needs psutil, which megatron-core does not declare: "
                              "without it each writer process raises and the save waits for them forever (pip "
                              "install psutil).")

        # Its torch_dist writer forks a writer process per bucket (joined before save returns) and collects their
        # results through a queue it makes with a spawn-context Manager: a World's rank is a daemonic process
        # (multiprocessing forbids it children) whose spawn would re-run no main; for the save the rank is not
        # daemonic and the collecting queue (read in this process: the save is synchronous) is an in-process one
        config = multiprocessing.current_process()._config
        daemon, held = config.get("daemon"), filesystem_async._results_queue
        config["daemon"], filesystem_async._results_queue = False, queue.Queue()
        try:
            with on_cpu():
                dist_checkpointing.save(self._sharded(False), str(directory))
        finally:
            config["daemon"], filesystem_async._results_queue = daemon, held

    def load(self, directory) -> None:
        with on_cpu():
            from megatron.core import dist_checkpointing

            chunks = self.trainer
            for opt in self._optimizers():
                if hasattr(opt, "_init_optimizer_states_with_dummy_values"):  # the distributed optimizer's states,
                    opt._init_optimizer_states_with_dummy_values()  # to be replaced in place by the load (its own)
            state = dist_checkpointing.load(self._sharded(True), str(directory))
            for i, chunk in enumerate(chunks):
                loaded = state["model"] if len(chunks) == 1 else state[f"model{i}"]
                chunk.module.load_state_dict({k.removeprefix("module."): v for k, v in loaded.items()})
            self.optimizer.load_state_dict(state["optimizer"])

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
