"""The pipeline contract: build a training step over this rank's stages, then run it per batch."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Pipeline(Protocol):
    """Pipeline-parallel training of a model split into ``num_stages`` stages, stage s on rank
    ``reference.pipeline.placement(schedule, p, virtual_stages)[s]`` of ``group`` (s mod p, or the V of zbv and
    dualpipev: stages r and 2p - 1 - r on rank r; p ranks; ``num_stages`` = p * virtual_stages)."""

    def build(self, stages, num_stages, schedule, num_microbatches, virtual_stages, loss_fn, batch_size,
              sample_shape, group=None):
        """Return an object with ``step(inputs, targets)``.

        ``stages`` maps each stage index this rank holds to its module; ``schedule`` is a name of
        ``reference.pipeline.GENERATORS`` (gpipe, 1f1b, interleaved, zb-h1, interleaved-zb, zbv,
        dualpipev); ``loss_fn(output, target)`` is sum-reduced. ``step`` runs forward and
        backward of the whole batch split along dim 0 into ``num_microbatches`` with ``tensor_split``
        (``inputs`` given on the rank of stage 0, ``targets`` on the rank of the last stage, None
        elsewhere); gradients accumulate as a SUM into the stages' parameters (no 1/m scaling); it
        returns the summed loss on the last stage's rank, None elsewhere. Activations between stages
        are (rows, *sample_shape) tensors. Raise ``Unsupported`` for a combination not supported.
        """
