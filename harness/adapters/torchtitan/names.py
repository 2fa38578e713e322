"""The contract's parameter names <-> torchtitan's, for what its Llama3 and Qwen3 blocks share (embedding,
norms, attention, dense FFN, head); ``harness.adapters.torchtitan.moe_stack`` maps the MoE's own. 0.2.x
(``v02``) names the attention's projections ``attention.w{q,k,v}`` (no ``qkv_linear``) and the head ``output``."""

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


_V02 = (("attention.qkv_linear.", "attention."), ("lm_head.", "output."))


def torchtitan_name(name: str, v02: bool = False) -> str:
    """The contract's parameter name -> torchtitan's (0.2.x's where ``v02``)."""
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    titan = f"layers.{m.group(1)}.{_BLOCK[m.group(2)]}" if m else _ENDS[name]
    for new, old in _V02 if v02 else ():
        titan = titan.replace(new, old)
    return titan


def contract_name(name: str, v02: bool = False) -> str:
    """torchtitan's parameter name (wrappers' prefixes removed; 0.2.x's where ``v02``) -> the contract's."""
    name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
    if v02:
        name = re.sub(r"attention\.(w[qkv])\.", r"attention.qkv_linear.\1.", name).replace("output.", "lm_head.")
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    return f"blocks.{m.group(1)}.{_BACK[m.group(2)]}" if m else _ENDS_BACK[name]
