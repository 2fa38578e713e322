"""megatron-core's parameters against the one-device model's: which slices of which dense tensors a rank's local
tensor holds (``_pieces``), and back (``_scatter_dense``)."""

from __future__ import annotations

import re

import torch


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
