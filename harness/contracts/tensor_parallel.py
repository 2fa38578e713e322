"""The tensor-parallel contract: shard a given dense layer, then hand back its full gradients."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

KINDS = ("column", "row", "mlp", "embedding", "lm_head", "attention")


@runtime_checkable
class TensorParallel(Protocol):
    """Sharded versions of dense layers over a group of n ranks (Megatron's layouts).

    kinds and their input/output on each rank (seq-first activations; with sequence_parallel the
    full activations below are split along dim 0 instead, this rank holding block ``rank``):
      "column"    (nn.Linear): input full; output this rank's block of the output features.
      "row"       (nn.Linear): input this rank's block of the input features; output full.
      "mlp"       (nn.Sequential(Linear, GELU, Linear)): input full; output full.
      "embedding" (nn.Embedding): input token ids (seq, batch), always full; output full.
      "lm_head"   (nn.Linear(hidden, vocab, bias=False)): called ``sharded(x, target)`` with x full and
                  target ids (seq, batch) full; returns the per-token cross-entropy of ``dense(x)``
                  against target (reduction none), (seq, batch), full on every rank — loss parallelism:
                  the logits are never gathered.
      "attention" (reference.tensor_parallel.DenseAttention: q, k, v, o Linears, ``heads``): input full;
                  output full; heads split across ranks.
    A feature, head, vocabulary or sequence size that does not divide by n is either refused
    (ValueError or Unsupported, one sentence), split as torch.chunk splits it, or padded (vocabulary,
    as Megatron does); never a silently wrong result.
    """

    def shard(self, kind, dense, group=None, sequence_parallel=False):
        """A module computing ``dense``'s function on this rank's shard, built from ``dense``'s own
        weights (the dense module is not modified). Raise ``Unsupported`` for what is not provided."""

    def full_grads(self, kind, sharded, group=None) -> dict:
        """After backward: every parameter's full gradient, keyed by ``dense.named_parameters()``'s
        names, gathered (and summed where ranks hold partial gradients) on every rank; padding removed."""
