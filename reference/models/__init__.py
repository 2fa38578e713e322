"""The model families, each defined once for one device (one module per family), and the ``ModelSpec``
that describes one: its one-device module is the oracle of every whole-stack property, and its parameter
names are the names every stack reports in.

- ``gpt``: LayerNorm, GELU MLP, full multi-head attention with biases (``GPT``); also the small models
  the ZeRO and pipeline suites train (``mlp``, ``TransformerBlock``);
- ``llama``: RMSNorm, rotary embedding, SwiGLU, grouped-query attention, no biases (``Llama``);
- ``moe``: the Llama family with a mixture of experts in place of each SwiGLU (``MoELlama``: ``experts``
  routed experts, ``top_k`` per token, ``shared_experts``, ``router`` scoring, the sequence-wise balance
  loss weighted by ``aux_coef``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .gpt import GPT, GPTBlock, TransformerBlock, mlp
from .llama import GQAttention, Llama, LlamaBlock, RMSNorm, SwiGLU, attend_gqa, rotate
from .moe_llama import MoEBlock, MoELlama

FAMILIES = ("gpt", "llama", "moe")


@dataclass(frozen=True)
class ModelSpec:
    """One model of a family. Fields a family does not read keep their defaults; a stack that meets a
    family, or a field value, it does not know refuses the spec in one sentence."""

    family: str = "gpt"
    """"gpt", "llama" or "moe" (later families add theirs)."""
    vocab: int = 13
    hidden: int = 16
    layers: int = 4
    heads: int = 4
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention; 1: multi-query); None: ``heads`` (llama only)."""
    ffn: int = 32
    rope_theta: float = 10000.0
    """The rotary embedding's base (llama)."""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon (llama; GPT's LayerNorm keeps torch's 1e-5)."""
    tie_embeddings: bool = False
    """The LM head's weight is the input embedding's (one parameter)."""
    dtype: str = "float64"
    """"float64", "float32", "bfloat16" or "float16" (the last two: the one-device model of the mixed-
    precision recipe)."""
    dropout: float = 0.0
    """Keyed dropout probability (gpt; the stacks draw one device's masks)."""
    experts: int = 4
    """Routed experts per MoE layer (moe)."""
    top_k: int = 2
    """Experts each token is routed to (moe)."""
    shared_experts: int = 0
    """Shared experts, every token's (moe): one SwiGLU of shared_experts x ffn."""
    router: str = "softmax"
    """The router's scoring (moe): "softmax" (top-k of the softmax) or "sigmoid" (DeepSeek-V3)."""
    renormalize: bool = True
    """The top-k weights renormalised to sum to 1 (moe); False: each expert weighted by its own score
    (DeepSpeed's and Switch's top-1, Megatron's ``moe_router_pre_softmax``)."""
    aux_coef: float = 0.01
    """The sequence-wise load-balancing loss's weight (moe)."""
    extra: dict = field(default_factory=dict, hash=False, compare=False)
    """Fields of later families (mixture of experts, long sequences): a stack refuses keys it does not know."""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {self.family!r}.")
        if self.dtype not in ("float64", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float64, float32, bfloat16 or float16; got {self.dtype!r}.")
        for name in ("vocab", "hidden", "layers", "heads", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}.")
        kv = self.kv_heads if self.kv_heads is not None else self.heads
        if kv < 1:
            raise ValueError(f"kv_heads must be >= 1; got {kv}.")
        if self.hidden % self.heads or self.heads % kv:
            raise ValueError(f"hidden ({self.hidden}) must divide by heads ({self.heads}) and heads by kv_heads "
                             f"({kv}).")
        if self.family == "moe":
            from .moe import SCORINGS

            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"top_k must be between 1 and experts ({self.experts}); got {self.top_k}.")
            if self.router not in SCORINGS:
                raise ValueError(f"router must be one of {', '.join(SCORINGS)}; got {self.router!r}.")
            if not isinstance(self.renormalize, bool):
                raise ValueError(f"renormalize must be True or False; got {self.renormalize!r}.")
            for name in ("shared_experts", "aux_coef"):
                if not getattr(self, name) >= 0:  # NaN too
                    raise ValueError(f"{name} must be >= 0; got {getattr(self, name)!r}.")
        if self.family == "gpt" and kv != self.heads:
            raise ValueError(f"the gpt family has full multi-head attention: kv_heads must be heads ({self.heads}); "
                             f"got {kv}.")

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    def build(self, seed: int = 0) -> torch.nn.Module:
        """The one-device model, its weights drawn from ``seed``."""
        torch.manual_seed(seed)
        dtype = getattr(torch, self.dtype)
        if self.family == "gpt":
            return GPT(self.vocab, self.hidden, self.heads, self.ffn, self.layers, dtype, dropout=self.dropout,
                       tie_embeddings=self.tie_embeddings)
        if self.family == "moe":
            return MoELlama(self.vocab, self.hidden, self.heads, self.kv, self.ffn, self.layers, self.rope_theta,
                            self.norm_eps, dtype, experts=self.experts, top_k=self.top_k, shared=self.shared_experts,
                            scoring=self.router, renormalize=self.renormalize, aux_coef=self.aux_coef,
                            tie_embeddings=self.tie_embeddings)
        return Llama(self.vocab, self.hidden, self.heads, self.kv, self.ffn, self.layers, self.rope_theta,
                     self.norm_eps, dtype, tie_embeddings=self.tie_embeddings)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


__all__ = ["FAMILIES", "GPT", "GPTBlock", "GQAttention", "Llama", "LlamaBlock", "MoEBlock", "MoELlama",
           "ModelSpec", "RMSNorm", "SwiGLU",
           "TransformerBlock", "attend_gqa", "mlp", "rotate"]
