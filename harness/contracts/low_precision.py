"""The low-precision contract: a bias-free linear layer trained under a float8 / MX recipe, over a layout that
shards it (``reference.low_precision.Layout``), held to one device running the same recipe.

Recipes (``reference.low_precision.RECIPES``): "float8-tensorwise", "float8-rowwise", "mxfp8" — what each of the
three GEMMs casts and how each scale is computed (docs/contracts/low_precision.md). Layouts: "replicated" (data
parallel), "column" and "row" (tensor parallel, with or without sequence parallelism), "fsdp" (the weight flat-sharded
over DP, with or without the float8 all-gather). The world is dp x tp ranks; rank r is TP rank r % tp of DP rank
r // tp.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class LowPrecision(Protocol):
    def shard(self, weight, recipe: str, layout, tp_group, dp_group):
        """A module for this rank: ``module(x_local) -> y_local`` for one call (this rank's part of a microbatch:
        ``reference.low_precision.local_part``), its backward accumulating into its parameters' ``.grad``, built from
        ``weight`` (N x K, float32; not modified). Raise ``Unsupported`` (one sentence) for a recipe or layout not
        provided, ``ValueError`` (one sentence) for one that cannot run (a block the shards would split)."""

    def full_grad(self, module, tp_group, dp_group):
        """After the backward passes of a step: the whole weight's gradient (N x K), summed over every call of every
        DP rank, on every rank (collective)."""

    def sgd_step(self, module, lr: float, tp_group, dp_group) -> None:
        """One SGD step (no momentum) of learning rate ``lr`` on the whole gradient — ``full_grad``'s, reduced over DP
        as the layout needs —, the gradients then cleared (collective)."""

    def full_weight(self, module, tp_group, dp_group):
        """The whole weight (N x K) as the module holds it now, on every rank (collective)."""


__all__ = ["LowPrecision"]
