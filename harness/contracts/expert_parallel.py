"""The expert-parallelism contract: the MoE family's feed-forward (``reference.models.moe.MoE``: a router,
E routed SwiGLU experts, optional shared experts, the load-balancing loss) over a group, its experts split
over EP groups of ``ep`` consecutive ranks (expert-data-parallel replicas across them).

Each rank is given its own tokens (tokens, hidden); the load-balancing loss is over **every token of the
group** (E x sum_i f_i P_i with f and P over the global token set; ``reference.models.moe``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ExpertParallel(Protocol):
    def shard(self, dense_moe, group, ep: int | None = None):
        """A module mapping this rank's tokens x (T, hidden) to (their rows of ``dense_moe``'s output over
        the group's tokens, the load-balancing loss over the group's tokens — the same scalar on every rank,
        whose backward counts it once), built from ``dense_moe``'s weights without modifying it; ``ep``:
        the EP size (None: the group's size). A capacity factor applies the layer's rule to each rank's own
        tokens (docs/contracts/expert_parallel.md). Raise ``Unsupported`` (one sentence) for what is not provided
        (a capacity factor, a scoring), ``ValueError`` (one sentence) for what cannot run (E % ep != 0)."""

    def full_grads(self, sharded, group) -> dict:
        """After backward of (sum over this rank's rows of y g) + aux on every rank: every parameter's
        gradient under ``dense_moe.named_parameters()``'s names (the router, every expert, the shared
        experts) — one device's gradient of the same loss over the group's tokens — on every rank."""


__all__ = ["ExpertParallel"]
