"""The collectives contract: what the suite asks of any collectives implementation."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Collectives(Protocol):
    """Collectives over a process group, in place on contiguous tensors of the rank's device.

    ``op`` is one of "sum", "avg", "max", "min", "product" (AVG only for floating dtypes); ``group``
    None means the world; ranks (``src``, ``dst``) are ranks within ``group``. Raise ``Unsupported``
    (or any ``NotImplementedError``) for what the implementation cannot do: never emulate it silently.
    """

    def all_reduce(self, tensor, op="sum", group=None) -> None:
        """tensor <- op over all ranks of tensor, elementwise, on every rank."""

    def reduce_scatter(self, output, input, op="sum", group=None) -> None:
        """output <- block ``rank`` of op over all ranks of input; input.numel() == size * output.numel().

        In place when ``output`` is rank r's block of ``input`` (nccl-tests' definition).
        """

    def all_gather(self, output, input, group=None) -> None:
        """output <- every rank's input, concatenated in rank order; output.numel() == size * input.numel().

        In place when ``input`` is rank r's block of ``output`` (nccl-tests' definition).
        """

    def broadcast(self, tensor, src, group=None) -> None:
        """tensor <- rank ``src``'s tensor, on every rank."""

    def reduce(self, tensor, dst, op="sum", group=None) -> None:
        """On rank ``dst``: tensor <- op over all ranks of tensor. Other ranks' tensors are unspecified."""

    def all_to_all(self, output, input, group=None) -> None:
        """Block j of rank r's flat input -> block r of rank j's flat output (size equal blocks)."""
