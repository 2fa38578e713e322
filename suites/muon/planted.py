"""Planted Muon bugs (each caught by suites/muon/test_equivalence.py, and in the mutation table)."""

from __future__ import annotations

from reference.muon.newton_schulz import newton_schulz
from reference.muon.sharded import ReferenceMuon, ShardedMuon


class _LocalNewtonSchulz(ShardedMuon):
    """Orthogonalises its own rows of each matrix (what a trainer that never gathers does: DeepSpeed #8441's and
    Megatron #5961's question), not the whole."""

    def orthogonal(self, name, update):
        import torch

        lr = self.spec.adjusted_lr(self.shapes[name])
        ortho = newton_schulz(update) if update.dim() == 2 and update.numel() else update.bfloat16()
        return [(torch.ones(update.numel(), dtype=torch.bool), ortho.flatten(), lr)]


class _FusedAsOne(ShardedMuon):
    """Orthogonalises a fused QKV / gate + up whole: its parts forgotten."""

    def __init__(self, params, spec, layout, group=None):
        import dataclasses

        super().__init__(params, dataclasses.replace(spec, parts={}), layout, group)


class _AdamWForMatrices(ShardedMuon):
    """Muon's matrices silently stepped by AdamW (DeepSpeed PR 8438's fallback under ZeRO-3, where every parameter
    looks 1-D)."""

    def __init__(self, params, spec, layout, group=None):
        import dataclasses

        super().__init__(params, dataclasses.replace(spec, adamw_names=("",)), layout, group)


class LocalNewtonSchulz(ReferenceMuon):
    optimizer = _LocalNewtonSchulz


class FusedAsOne(ReferenceMuon):
    optimizer = _FusedAsOne


class AdamWForMatrices(ReferenceMuon):
    optimizer = _AdamWForMatrices


__all__ = ["AdamWForMatrices", "FusedAsOne", "LocalNewtonSchulz"]
