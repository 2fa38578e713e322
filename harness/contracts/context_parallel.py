"""The context-parallelism contract: the Llama family's attention (``reference.models.GQAttention``: q / k /
v / o projections, rotary embedding, grouped-query heads, causal or not) over a CP group, the sequence
split by a layout.

Layouts (``reference.context_parallel.layout``): "contiguous" (rank r holds the r-th of cp equal chunks)
and "zigzag" (of 2 cp chunks, rank r holds chunks r and 2 cp - 1 - r, in that order). Activations are
batch-first: x (batch, seq, hidden); this rank's shard is x[:, its tokens, :].
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

LAYOUTS = ("contiguous", "zigzag")


@runtime_checkable
class ContextParallel(Protocol):
    def shard(self, dense, group, layout: str):
        """A module mapping this rank's shard of x (batch, seq / cp, hidden), per ``layout``, to the same
        shard of ``dense(x, positions=arange(seq))``, built from ``dense``'s own weights (the dense module is
        not modified). Raise ``Unsupported`` (one sentence) for a layout or head layout not provided, and
        ``ValueError`` (one sentence) for one that cannot run (heads that do not split over cp); a sequence
        the layout cannot split evenly is refused by the module's forward in one sentence."""

    def full_grads(self, sharded, group) -> dict:
        """After backward: every parameter's full gradient under ``dense.named_parameters()``'s names, on
        every rank (collective)."""


__all__ = ["LAYOUTS", "ContextParallel"]
