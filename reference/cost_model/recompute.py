"""Activation checkpointing: extra compute of recomputation and sqrt(n) memory (Chen et al. 2016)."""

from __future__ import annotations

import math

from ._checks import positive, whole


def recompute_overhead(backward_to_forward: float = 2.0, recomputed_fraction: float = 1.0) -> float:
    """Extra compute per step, as a fraction of the step without checkpointing.

    Full checkpointing reruns the forward once more (recomputed_fraction = 1): F / (F + B) =
    1 / (1 + backward_to_forward) = 1/3 ≈ +33 % with backward = 2 x forward (Chen et al. 2016,
    section 4; Korthikanti et al. 2022, section 5). Selective recomputation reruns a fraction of it.
    """
    positive("backward_to_forward", backward_to_forward, allow_zero=True)
    if not 0 <= recomputed_fraction <= 1:
        raise ValueError(f"recomputed_fraction must be between 0 and 1; got {recomputed_fraction!r}.")
    return recomputed_fraction / (1 + backward_to_forward)


def checkpoint_segments(layers: int) -> int:
    """The segment count k minimising ceil(L / k) + k (about sqrt(L)); ties go to the smaller k."""
    whole("layers", layers)
    return min(range(1, layers + 1), key=lambda k: (math.ceil(layers / k) + k, k))


def sqrt_checkpoint_memory(layers: int, layer_activation_bytes: float = 1.0) -> float:
    """Peak activation memory with sqrt(L) checkpointing, in units of one layer's activations.

    Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", section 3: with the L layers cut
    into k segments, the k segment inputs are kept and one segment (ceil(L / k) layers) is live during
    its recomputation: ceil(L / k) + k layer-activations, 2 sqrt(L) at k = sqrt(L), versus L without.
    """
    positive("layer_activation_bytes", layer_activation_bytes, allow_zero=True)
    k = checkpoint_segments(layers)
    return (math.ceil(layers / k) + k) * layer_activation_bytes
