"""torchtitan (0.3.x; 0.2.x through ``torchtitan_v02.py``) under the stack contract, through its own code: its
``Llama3Model`` built from a config of the spec's sizes, its ``parallelize_llama`` (TP with its sequence and loss
parallelism, activation checkpointing, FSDP2 or replicate over dp), its ``CrossEntropyLoss`` normalised by the
global token count as its trainer does, its ``clip_grad_norm_``, its ``OptimizersContainer`` — and DCP for save /
load. The step mirrors ``torchtitan.trainer.Trainer.train_step`` (the trainer itself needs a data loader, a
tokenizer and a job config; nothing of the training arithmetic is in them).

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

from ..contracts import Unsupported
from .torchtitan_import import v02
from .torchtitan_trainer import SCHEDULES, SPMD_BACKEND, TorchtitanStackTrainer, model_config

__all__ = ["SPMD_BACKEND", "TorchtitanStack", "TorchtitanStackTrainer", "model_config", "v02"]


def _unsupported(spec, layout, recipe) -> str | None:
    if v02():
        from .torchtitan_v02 import unsupported

        why = unsupported(spec, layout, recipe)
        if why:
            return why
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
        if v02():
            from .torchtitan_v02 import TorchtitanV02Trainer

            return TorchtitanV02Trainer(spec, layout, recipe)
        return TorchtitanStackTrainer(spec, layout, recipe)
