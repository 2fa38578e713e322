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

from harness.adapters.torchtitan.imports import v02
from harness.adapters.torchtitan.low_precision import MXFP8_WHY
from harness.adapters.torchtitan.lr import unsupported as lr_unsupported
from harness.adapters.torchtitan.trainer import (
    CHUNKED,
    SCHEDULES,
    SPMD_BACKEND,
    TorchtitanStackTrainer,
    model_config,
)
from harness.contracts import Unsupported
from harness.stack.supports import Rule, Supports, always

__all__ = ["SPMD_BACKEND", "TorchtitanStack", "TorchtitanStackTrainer", "model_config", "v02"]


def _v02(spec, layout, recipe) -> str | None:
    from harness.adapters.torchtitan.v02 import unsupported

    return unsupported(spec, layout, recipe) if v02() else None


def _moe(spec, layout, recipe) -> str | None:
    from harness.adapters.torchtitan.moe_stack import unsupported

    return unsupported(spec, layout)


SUPPORTS = Supports("the torchtitan stack", unsupported=(
    Rule(lambda s, lay, r: r.low_precision == "mxfp8", MXFP8_WHY),
    Rule(lambda s, lay, r: r.low_precision not in (None, "float8-rowwise"),
         lambda s, lay, r: f"torchtitan's float8 converter offers the rowwise recipes (recipe_name rowwise, "
                           f"rowwise_with_gw_hp), not {r.low_precision}."),
    Rule(always, _v02),
    Rule(lambda s, lay, r: r.lr_schedule is not None, lambda s, lay, r: lr_unsupported(r.lr_schedule)),
    Rule(lambda s, lay, r: s.family == "moe" and lay.replicate > 1,
         "the torchtitan MoE stack here shards over dp_shard alone (its EP carves efsdp from it); hybrid sharding is "
         "not composed with it."),
    Rule(lambda s, lay, r: s.family == "moe", _moe),
    Rule(lambda s, lay, r: s.family not in ("llama", "moe"),
         lambda s, lay, r: "the torchtitan stack here trains its Llama3 (the llama family) and its Qwen3 MoE (the moe "
                           f"family), not the {s.family} family."),
    Rule(lambda s, lay, r: s.family == "llama" and s.dtype not in ("float32", "bfloat16"),
         lambda s, lay, r: "torchtitan computes the rotary embedding in float32 whatever the parameters' dtype "
                           "(CosSinRoPE.apply_rotary_emb casts q, k and its cache): it trains float32, or bf16 through "
                           f"FSDP2's mixed precision; a {s.dtype} spec is not what it computes."),
    Rule(lambda s, lay, r: r.optimizer.name == "muon",
         "torchtitan's Muon (DistMuon, its FlexShard optimizer) runs on CUDA only — it refuses other devices "
         "(\"DistMuon requires one CUDA device per process\") and needs per-parameter compute layouts this adapter "
         "does not set: not driven yet."),
    Rule(lambda s, lay, r: r.optimizer.name not in ("adam", "adamw"),
         lambda s, lay, r: f"torchtitan's optimizers are Adam, AdamW and Muon; {r.optimizer.name} is not one of them."),
    Rule(lambda s, lay, r: lay.dp > 1 and lay.zero == 1,
         "torchtitan replicates (ZeRO 0) or shards with FSDP2 (ZeRO 2 / 3) over dp; ZeRO 1 it does not do."),
    Rule(lambda s, lay, r: lay.cp > 1, "the torchtitan stack here has no context parallelism yet."),
    Rule(lambda s, lay, r: lay.ep > 1 and s.family != "moe",
         lambda s, lay, r: f"ep = {lay.ep} splits experts: the {s.family} family has none."),
    Rule(lambda s, lay, r: s.tie_embeddings and lay.pp > 1,
         "torchtitan does not tie the embedding to the LM head under pipeline parallelism (its own refusal)."),
    Rule(lambda s, lay, r: r.loss_scale is not None,
         "the torchtitan stack here has no loss scaler (float32 needs none)."),
    Rule(lambda s, lay, r: lay.checkpoint_policy == "selective",
         "torchtitan's op-level selective checkpointing recomputes every second matmul (SelectiveAC's "
         "forward_mm_count % 2 == 0): its own policy, not the contract's (every matmul's output saved)."),
), optimizers=("adam", "adamw"), hybrid=True, compiles=True, schedules=True, refused=(
    Rule(lambda s, lay, r: lay.schedule in CHUNKED and 2 * lay.pp > s.layers,
         lambda s, lay, r: f"the {lay.schedule} schedule's 2 x pp = {2 * lay.pp} model chunks need as many layers; the "
                           f"model has {s.layers}."),
    Rule(lambda s, lay, r: lay.pp > 1 and lay.schedule != "gpipe" and lay.num_microbatches < lay.pp,
         lambda s, lay, r: f"torch's {SCHEDULES[lay.schedule]} schedule (torchtitan's pipeline) needs at least as many "
                           f"micro-batches as stages: {lay.num_microbatches} < pp = {lay.pp}."),
    Rule(lambda s, lay, r: lay.pp > 1 and lay.schedule == "dualpipev" and lay.num_microbatches < 2 * lay.pp,
         lambda s, lay, r: f"torch's DualPipeV (torchtitan's pipeline) needs at least as many micro-batches as its "
                           f"2 x pp = {2 * lay.pp} stages; got {lay.num_microbatches}."),
    Rule(lambda s, lay, r: s.heads % lay.tp or s.kv % lay.tp,
         lambda s, lay, r: f"tp ({lay.tp}) must divide the attention heads ({s.heads}) and the KV heads ({s.kv}): "
                           "torchtitan splits both, it does not replicate KV heads."),
    Rule(lambda s, lay, r: s.family == "moe" and s.experts % lay.ep,
         lambda s, lay, r: f"the {s.experts} experts do not split evenly over ep = {lay.ep} (torchtitan shards its "
                           "grouped experts' first dimension over the EP mesh)."),
))



class TorchtitanStack:
    description = "torchtitan: its Llama3Model + parallelize_llama (TP/SP/loss parallel, FSDP2 / replicate, AC)"
    options: dict = {}
    """What an option passes its trainer (``CpuOffload``)."""

    def build(self, spec, layout, recipe, group=None):
        SUPPORTS.check(spec, layout, recipe)
        from harness.adapters.torchtitan.imports import import_torchtitan

        import_torchtitan()
        if v02():
            from harness.adapters.torchtitan.v02 import TorchtitanV02Trainer

            return TorchtitanV02Trainer(spec, layout, recipe)
        return TorchtitanStackTrainer(spec, layout, recipe, **self.options)


class CpuOffload(TorchtitanStack):
    description = ("torchtitan with training.enable_cpu_offload: FSDP2's CPUOffloadPolicy, the sharded parameters, "
                   "their gradients and the optimizer's step on the host")
    options = {"cpu_offload": True}

    def build(self, spec, layout, recipe, group=None):
        from harness.runtime.capabilities import pinned_memory_unsupported

        why = pinned_memory_unsupported()
        if why:  # torchtitan's apply_fsdp builds CPUOffloadPolicy() (pin_memory=True), which pins its host shards
            raise Unsupported(f"torchtitan's enable_cpu_offload pins the host copies (CPUOffloadPolicy's default "
                              f"pin_memory=True) and {why}")
        trainer = super().build(spec, layout, recipe, group)
        if not isinstance(trainer, TorchtitanStackTrainer):
            raise Unsupported("the CpuOffload option drives torchtitan 0.3's trainer, not 0.2's.")
        return trainer
