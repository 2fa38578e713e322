"""Context parallelism's costs per rank and layer: the bytes ring attention and Ulysses send, and the
activation memory a rank holds (what cp divides and what it does not).

Bytes (b batch, s the whole sequence, s / cp per rank, h query heads, h_kv KV heads of d, e bytes):
- ring (pass-KV, ``reference.context_parallel.ring``): one K/V block = 2 b h_kv (s / cp) d e; forward
  cp - 1 blocks (each rank passes every block on but its last); backward cp - 1 blocks of K/V and cp of
  dK/dV (the accumulators travel with their block and make one more hop home): 2 cp - 1 blocks.
- Ulysses (``reference.context_parallel.ulysses``): four all-to-alls each way — q and the output (h heads),
  k and v (max(h_kv, cp) heads: fewer KV heads than ranks are replicated first) — each sending
  (cp - 1) / cp of b (s / cp) n d e for n heads.
These are exact for the reference (measured, ``suites/context_parallel``).
"""

from __future__ import annotations

from ._checks import choice, whole
from .memory import activation_memory

CP_ALGORITHMS = ("ring", "ulysses")


def cp_layer_comm_bytes(algorithm: str, batch: int, seq: int, heads: int, kv_heads: int, head_dim: int, cp: int,
                        element_size: float = 2) -> dict:
    """{"forward", "backward", "total"}: bytes one rank sends per layer (see the module's docstring)."""
    choice("algorithm", algorithm, CP_ALGORITHMS)
    for name, value in (("batch", batch), ("seq", seq), ("heads", heads), ("kv_heads", kv_heads),
                        ("head_dim", head_dim), ("cp", cp)):
        whole(name, value)
    if seq % cp:
        raise ValueError(f"cp ({cp}) must divide the sequence ({seq} tokens).")
    local = seq // cp
    if algorithm == "ring":
        block = 2 * batch * kv_heads * local * head_dim * element_size
        forward, backward = (cp - 1) * block, (2 * cp - 1) * block if cp > 1 else 0.0
    else:
        per_head = batch * local * head_dim * element_size * (cp - 1) / cp
        forward = backward = per_head * (2 * heads + 2 * max(kv_heads, cp))
    return {"forward": forward, "backward": backward, "total": forward + backward}


def cp_activation_memory(algorithm: str, seq: int, batch: int, hidden: int, heads: int, layers: int = 1, *,
                         cp: int, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Activation bytes per rank (``activation_memory``'s accounting, 16-bit activations) under cp.

    Every per-token activation divides by cp: a rank holds s / cp tokens. The attention scores (the
    5 a s^2 b / t term) do not divide the same way: ring attention recomputes each block's probabilities
    in backward from the log-sum-exp (nothing of the s x s scores is kept — as selective recomputation);
    Ulysses attends with h / cp heads over the whole sequence, so its scores are the whole sequence's
    divided by cp. What stays whole: the weights (not activations) — and, under Ulysses, each head's full
    s x s attention."""
    choice("algorithm", algorithm, CP_ALGORITHMS)
    whole("cp", cp)
    if seq % cp:
        raise ValueError(f"cp ({cp}) must divide the sequence ({seq} tokens).")
    if algorithm == "ring":
        kept = recompute if recompute != "none" else "selective"  # no s x s scores kept
        return activation_memory(seq // cp, batch, hidden, heads, layers, tp=tp, sequence_parallel=sequence_parallel,
                                 recompute=kept)
    return activation_memory(seq, batch, hidden, heads, layers, tp=tp, sequence_parallel=sequence_parallel,
                             recompute=recompute) / cp
