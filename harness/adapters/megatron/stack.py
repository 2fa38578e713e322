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

import torch.distributed as dist

from harness.contracts import Unsupported
from harness.stack.supports import Rule, Supports


def _muon(spec, layout, recipe) -> str:
    """Why the Megatron stack does not train the contract's Muon (torch's iteration): what megatron-core's own Muon
    (``get_megatron_muon_optimizer``) computes, and what it needs to run at all here."""
    import importlib.util
    import sys

    needs = "" if importlib.util.find_spec("emerging_optimizers") else (
        f" it needs emerging-optimizers, whose one release (0.3.0) needs Python >= 3.12 (this is "
        f"{sys.version_info.major}.{sys.version_info.minor}), and")
    return ("megatron-core's Muon (get_megatron_muon_optimizer) is not torch's:" + needs + " it iterates "
            "emerging-optimizers' 'quintic' Newton-Schulz (five coefficient sets in turn, not torch's one) with no "
            "option to change it; and 0.16.1's TensorParallelMuon does not construct against emerging-optimizers "
            "0.3.0 (harness/stack/findings.py).")


def _chunks(spec, layout) -> int:
    return 2 * layout.pp if layout.schedule == "interleaved" and layout.pp > 1 else layout.pp


SUPPORTS = Supports("the Megatron stack", unsupported=(
    Rule(lambda s, lay, r: r.low_precision is not None,
         "megatron-core trains float8 through TransformerEngine (fp8_autocast, CUDA only); without it it has no float8"
         " / MX recipe to drive here."),
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
    Rule(lambda s, lay, r: r.optimizer.name == "muon", _muon),
    Rule(lambda s, lay, r: lay.zero > 1,
         "Megatron's distributed optimizer shards optimizer state and fp32 master weights over dp, its gradients "
         "reduce-scattered into a whole buffer (ZeRO 1); ZeRO 2 / 3 is megatron_fsdp (Megatron-FSDP, its HFSDP too), "
         "which runs on CUDA devices only (its side streams are torch.cuda's): not driven here."),
    Rule(lambda s, lay, r: lay.zero == 1 and not r.optimizer.adam,
         "megatron-core's distributed optimizer (ZeRO 1) takes Adam only (its own assertion)."),
    Rule(lambda s, lay, r: lay.pp > 1 and lay.schedule == "gpipe",
         "megatron-core's pipeline schedules are 1F1B and interleaved 1F1B; it has no GPipe."),
    Rule(lambda s, lay, r: lay.pp > 1 and lay.schedule not in ("gpipe", "1f1b", "interleaved"),
         lambda s, lay, r: f"megatron-core's pipeline schedules are 1F1B and interleaved 1F1B; it has no "
                           f"{lay.schedule} (get_forward_backward_func)."),
    Rule(lambda s, lay, r: r.max_grad_norm is not None and r.norm_type != 2.0,
         lambda s, lay, r: f"megatron-core's optimizer clips the global 2-norm (clip_grad), not the {r.norm_type} "
                           "norm."),
    Rule(lambda s, lay, r: r.loss_scale is not None,
         "the Megatron stack here has no loss scaler (float32 and bf16 need none)."),
), optimizers=("sgd", "adam", "adamw"), schedules=True, refused=(
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

        from harness.adapters.megatron.trainer import MegatronStackTrainer, distributed_optimizer_readable

        if layout.zero == 1:  # the distributed optimizer: its state read through its private readers
            distributed_optimizer_readable()
        return MegatronStackTrainer(spec, layout, recipe, self.ddp_options)

    ddp_options: dict = {}
    """``DistributedDataParallelConfig`` fields an option sets (Megatron-LM's arguments)."""


class OverlapGradReduce(MegatronStack):
    """Megatron-LM's ``--overlap-grad-reduce`` (with its default ``--align-grad-reduce``): each bucket's reduction
    starts in backward as its gradients are ready (``grad_sync_func``: the chunks' ``start_grad_sync``), buckets of
    1,000 parameters so that this small model has many; with the distributed optimizer its reduce-scatters."""

    description = "megatron-core with Megatron-LM's --overlap-grad-reduce (buckets of 1,000 parameters)"
    ddp_options = {"overlap_grad_reduce": True, "bucket_size": 1000}
