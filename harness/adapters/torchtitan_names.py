"""The contract's parameter names <-> torchtitan's, for what its Llama3 and Qwen3 blocks share (embedding,
norms, attention, dense FFN, head); ``harness.adapters.torchtitan_moe_stack`` maps the MoE's own."""

from __future__ import annotations

import re

_BLOCK = {"attn_norm.weight": "attention_norm.weight", "mlp_norm.weight": "ffn_norm.weight",
          "attn.q.weight": "attention.qkv_linear.wq.weight", "attn.k.weight": "attention.qkv_linear.wk.weight",
          "attn.v.weight": "attention.qkv_linear.wv.weight", "attn.o.weight": "attention.wo.weight",
          "mlp.gate.weight": "feed_forward.w1.weight", "mlp.up.weight": "feed_forward.w3.weight",
          "mlp.down.weight": "feed_forward.w2.weight"}
_ENDS = {"embed.weight": "tok_embeddings.weight", "ln_f.weight": "norm.weight", "head.weight": "lm_head.weight"}
_BACK = {v: k for k, v in _BLOCK.items()}
_ENDS_BACK = {v: k for k, v in _ENDS.items()}


def torchtitan_name(name: str) -> str:
    """The contract's parameter name -> torchtitan's."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    return f"layers.{m.group(1)}.{_BLOCK[m.group(2)]}" if m else _ENDS[name]


def contract_name(name: str) -> str:
    """torchtitan's parameter name (wrappers' prefixes removed) -> the contract's."""
    name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    return f"blocks.{m.group(1)}.{_BACK[m.group(2)]}" if m else _ENDS_BACK[name]
