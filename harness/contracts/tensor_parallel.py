"""The tensor-parallel contract: shard a given dense layer, then hand back its full gradients."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class TensorParallel(Protocol):
    """Sharded versions of dense layers over a group of n ranks (Megatron's layouts).

    kinds and their input/output on each rank (seq-first activations; with sequence_parallel the
    full tensors below are split along dim 0 instead, this rank holding block ``rank``):
      "column" (nn.Linear): input full; output this rank's block of the output features.
      "row"    (nn.Linear): input this rank's block of the input features; output full.
      "mlp"    (nn.Sequential(Linear, GELU, Linear)): input full; output full.
    A feature or sequence size that does not divide by n is either refused (ValueError or Unsupported,
    one sentence) or split as torch.chunk splits it; never a silently wrong result.
    """

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        """A module computing ``dense``'s function on this rank's shard, built from ``dense``'s own
        weights (the dense module is not modified). Raise ``Unsupported`` for what is not provided."""

    def full_grads(self, kind, sharded, group=None) -> dict:
        """After backward: every parameter's full gradient, keyed by ``dense.named_parameters()``'s
        names, gathered (and summed where ranks hold partial gradients) on every rank."""
