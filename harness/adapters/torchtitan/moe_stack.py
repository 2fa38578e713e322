"""torchtitan's mixture of experts inside its stack (0.3.x): the MoE family trained by torchtitan's Qwen3 model
code — its ``Qwen3Model`` of ``Qwen3TransformerBlock``s (GQA attention, then its ``MoE``: ``TokenChoiceTopKRouter``,
``RoutedExperts`` = ``AllToAllTokenDispatcher`` + ``GroupedExperts``, shared experts as its ``FeedForward``),
sharded by its ``set_qwen3_sharding_config`` and parallelized by its ``parallelize_qwen3`` (EP through
``ParallelDims(expert_parallel_degree=ep)``: the experts split over ep, their FSDP over the expert-data-parallel
``efsdp`` mesh; TP and SP, FSDP2 / replicate, activation checkpointing, pipelining as for the Llama) — with the
training step, loss, clipping, optimizers and checkpoint of ``harness.adapters.torchtitan.stack`` (its trainer
calls ``model``, ``titan_state`` and ``dense_entries`` here for the moe family).

What the adapter chooses, and why (the rest is the Llama stack's):
- the MoE family's model is torchtitan's Qwen3 without its QK norm (``qk_norm=None``: the family's attention is
  the Llama's) and with the rotate-half ``CosSinRoPE`` Qwen3 uses; every block an MoE block;
- **bf16 only**: torchtitan's grouped experts compute in bfloat16 whatever the parameters' dtype
  (``GroupedExperts.forward`` casts tokens and weights for ``torch._grouped_mm``), so a float32 spec is not what
  it computes; a bf16 spec trains as torchtitan trains (FSDP2's bf16 parameters, fp32 masters and reduction)
  and is held precision-matched to the contract's bf16 recipe (``harness.stack.mixed``);
- **no load-balancing loss**: torchtitan balances by the selection bias alone (auxiliary-loss-free), so a spec
  with ``aux_coef`` > 0 is unsupported; ``route_norm`` is the family's ``renormalize``; the softmax router
  (Qwen3's) has no bias (``load_balance_coeff=None``); the sigmoid router (DeepSeek-V3's) chooses by scores + its
  ``expert_bias_E``,
  loaded from the family's fixed bias. torchtitan's trainers move that bias between steps
  (``register_moe_load_balancing_hook``, an optimizer pre-step hook); the family defines no such rule, so the
  hook is not registered and the bias stays the family's — what the comparison cannot hold is not run;
- the experts' weights are one parameter per projection, ``moe.routed_experts.inner_experts.w{1,3}_EFD``
  (E, ffn, hidden) and ``w2_EDF`` (E, hidden, ffn): expert e's gate / up / down is row e — loaded stacked,
  reported split under the contract's ``blocks.<i>.moe.experts.<e>.{gate,up,down}.weight`` (their Adam state
  split alike); ``moe.router.gate.weight`` is the router, ``moe.shared_experts.w{1,3,2}`` the shared expert.
"""

from __future__ import annotations

import re

import torch

from harness.adapters.torchtitan.names import contract_name, torchtitan_name

_EXPERTS = {"w1_EFD": "gate", "w3_EFD": "up", "w2_EDF": "down"}
_MOE = {"router.weight": "router.gate.weight", **{f"shared.{v}.weight": f"shared_experts.{k[:2]}.weight"
                                                  for k, v in _EXPERTS.items()}}
_MOE_BACK = {v: k for k, v in _MOE.items()}
GROUPED = "moe.routed_experts.inner_experts."


def unsupported(spec, layout) -> str | None:
    """Why torchtitan's MoE stack does not run this MoE spec / layout, in one sentence (None: it does)."""
    if spec.dtype != "bfloat16":
        return ("torchtitan's grouped experts compute in bfloat16 whatever the parameters' dtype (GroupedExperts."
                f"forward casts for torch._grouped_mm): its MoE trains bf16; a {spec.dtype} spec is not what it "
                "computes.")
    if spec.aux_coef:
        return ("torchtitan's MoE has no load-balancing loss (it balances by the selection bias alone): a spec with "
                f"aux_coef = {spec.aux_coef} is not what it trains; set aux_coef = 0.")
    experts_ffn = spec.ffn // layout.tp if layout.ep == 1 else spec.ffn  # TP splits the experts without EP
    if spec.hidden % 8 or experts_ffn % 8:
        split = f" (ffn / tp {layout.tp})" if experts_ffn != spec.ffn else ""
        return (f"torch._grouped_mm (torchtitan's experts) needs every bf16 row a multiple of 16 bytes: hidden "
                f"{spec.hidden} and the experts' ffn {experts_ffn}{split} must be multiples of 8.")
    carved = (layout.dp if layout.zero else 1) * layout.tp  # ZeRO 0 replicates over dp: no FSDP ranks there
    if layout.ep > 1 and carved % layout.ep:
        return (f"torchtitan carves ep from its FSDP x TP ranks (efsdp = dp_shard x tp / ep); ep = {layout.ep} does "
                f"not divide {'dp x ' if layout.zero else ''}tp = {carved}"
                f"{' (ZeRO 0 replicates over dp)' if not layout.zero else ''}.")
    return None


def moe_model_config(spec, seq: int = 64):
    """torchtitan's ``Qwen3Model.Config`` of the MoE spec's sizes: no QK norm, rotate-half RoPE, the SDPA core,
    every block's FFN torchtitan's ``MoE`` (no init: the weights are loaded from the one-device model)."""
    from torchtitan.models.common import Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import (
        make_ffn_config,
        make_gqa_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.common.rope import CosSinRoPE
    from torchtitan.models.qwen3 import Qwen3Model
    from torchtitan.models.qwen3.model import Qwen3TransformerBlock

    keep = {"weight": lambda t: t}  # the weights come from load_dense
    experts_keep = {name: (lambda t: t) for name in _EXPERTS}
    hidden, E, k = spec.hidden, spec.experts, spec.top_k

    def norm():
        return RMSNorm.Config(normalized_shape=hidden, eps=spec.norm_eps, param_init=keep)

    def moe():
        shared = None
        if spec.shared_experts:
            shared = make_ffn_config(dim=hidden, hidden_dim=spec.ffn * spec.shared_experts, w1_param_init=keep,
                                     w2w3_param_init=keep)
        return make_moe_config(
            num_experts=E, shared_experts=shared,
            router=make_router_config(dim=hidden, num_experts=E, gate_param_init=keep, top_k=k,
                                      score_func=spec.router, route_norm=spec.renormalize),
            routed_experts=make_routed_experts_config(dim=hidden, hidden_dim=spec.ffn, num_experts=E, top_k=k,
                                                      param_init=experts_keep, comm_backend="standard"),
            load_balance_coeff=1e-3 if spec.router == "sigmoid" else None)  # a coefficient makes its bias buffer

    head = hidden // spec.heads
    layers = [Qwen3TransformerBlock.Config(
        attention_norm=norm(), ffn_norm=norm(), moe=moe(),
        attention=make_gqa_config(dim=hidden, n_heads=spec.heads, n_kv_heads=spec.kv, head_dim=head,
                                  wqkv_param_init=keep, wo_param_init=keep, fuse_qkv=False, qk_norm=None,
                                  inner_attention=ScaledDotProductAttention.Config(),
                                  rope=CosSinRoPE.Config(dim=head, max_seq_len=seq, theta=spec.rope_theta)))
        for _ in range(spec.layers)]
    return Qwen3Model.Config(
        dim=hidden, vocab_size=spec.vocab, norm=norm(), layers=layers, enable_weight_tying=spec.tie_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=spec.vocab, embedding_dim=hidden, param_init=keep),
        lm_head=Linear.Config(in_features=hidden, out_features=spec.vocab, param_init=keep))


def titan_state(model) -> dict:
    """The MoE family's one-device weights under torchtitan's Qwen3 names (float32): each projection's experts
    stacked into its grouped parameter; the sigmoid router's selection bias as ``moe.expert_bias_E``."""
    out, experts = {}, {}
    for name, value in model.state_dict().items():
        value = value.detach().clone().to(torch.float32)
        m = re.fullmatch(r"blocks\.(\d+)\.moe\.(.+)", name)
        if m is None:
            out[torchtitan_name(name)] = value
            continue
        block, rest = m.groups()
        e = re.fullmatch(r"experts\.(\d+)\.(gate|up|down)\.weight", rest)
        if e:
            experts.setdefault((block, e.group(2)), {})[int(e.group(1))] = value
        else:
            out[f"layers.{block}.moe.{_MOE[rest]}"] = value
    by_role = {v: k for k, v in _EXPERTS.items()}
    for (block, role), rows in experts.items():
        out[f"layers.{block}.{GROUPED}{by_role[role]}"] = torch.stack([rows[e] for e in sorted(rows)])
    for i, block in enumerate(model.blocks):
        if block.moe.scoring == "sigmoid":
            out[f"layers.{i}.moe.expert_bias_E"] = block.moe.bias.detach().to(torch.float32)
    return out


def dense_entries(name: str, value, state: dict):
    """(contract name, full tensor, its optimizer state) of torchtitan's parameter ``name``: a grouped experts'
    parameter split into one entry per expert."""
    name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
    m = re.fullmatch(r"layers\.(\d+)\.moe\.(.+)", name)
    if m is None:
        yield contract_name(name), value, state
        return
    block, rest = m.groups()
    if rest.startswith("routed_experts.inner_experts."):
        role = _EXPERTS[rest.rsplit(".", 1)[1]]
        for e in range(len(value)):
            yield (f"blocks.{block}.moe.experts.{e}.{role}.weight", value[e].clone(),
                   {key: t[e].clone() for key, t in state.items()})
    else:
        yield f"blocks.{block}.moe.{_MOE_BACK[rest]}", value, state


def model(spec, parallelism):
    """(torchtitan's Qwen3 config of the MoE spec, its sharding declared for ``parallelism``; parallelize_qwen3) —
    what ``Qwen3Model.Config.update_from_config`` does, without the trainer module it imports."""
    from torchtitan.models.qwen3 import parallelize_qwen3
    from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

    config = moe_model_config(spec)
    set_qwen3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel,
                              enable_ep=parallelism.expert_parallel_degree > 1)
    return config, parallelize_qwen3
