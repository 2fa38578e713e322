"""The Muon contract: an optimizer that steps a model's parameters with Muon (its matrices) and AdamW (the rest),
sharded over a process group, held to one device (``reference.muon.one_device``: torch's Muon, bit for bit, with
fused matrices orthogonalised per logical part).

``spec`` is a ``reference.muon.MuonSpec`` (hyper-parameters, which parameters Muon takes, the fused matrices'
parts); ``layout`` one of ``reference.muon.LAYOUTS`` — which part of every parameter each rank holds
(``reference.muon.local_part``: "replicated", "rows", "cols", "flat")."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Muon(Protocol):
    def shard(self, params: dict, spec, layout: str, group):
        """This rank's optimizer over its part of ``params`` (name -> whole float32 tensor, the same on every rank;
        the implementation may keep them). Raise ``Unsupported`` (one sentence) for a spec or layout not provided,
        ``ValueError`` (one sentence) for one that cannot run."""

    def step(self, state, grads: dict) -> None:
        """One optimizer step from ``grads`` (name -> this rank's part of the reduced gradient, as ``local_part``
        cuts it; collective)."""

    def full(self, state) -> dict:
        """name -> the whole parameter as the optimizer holds it now, on every rank (collective)."""


__all__ = ["Muon"]
