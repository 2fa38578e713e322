"""Rank-side helpers for the collectives suites (module-level, so a World can call them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference import collectives as rc


def bytes_sent(algorithm: str, numel: int, dtype: str, root: int, piece_bytes: int | None) -> int:
    """Run one reference algorithm on zeros (on the rank's device: nccl's default group has no CPU backend) and
    return the bytes this rank says it sent."""
    from harness.runtime.rank import rank_device

    n, device = dist.get_world_size(), rank_device()
    dt = getattr(torch, dtype)
    t = torch.zeros(numel, dtype=dt, device=device)
    if algorithm == "ring_all_reduce":
        return rc.ring_all_reduce(t, "sum", None, piece_bytes)
    if algorithm in ("rhd_all_reduce", "tree_all_reduce", "naive_all_reduce"):
        return getattr(rc, algorithm)(t, "sum", None)
    if algorithm == "ring_reduce_scatter":
        return rc.ring_reduce_scatter(t, torch.zeros(n * numel, dtype=dt, device=device), "sum", None, piece_bytes)
    if algorithm == "ring_all_gather":
        return rc.ring_all_gather(torch.zeros(n * numel, dtype=dt, device=device), t, None, piece_bytes)
    if algorithm == "tree_broadcast":
        return rc.tree_broadcast(t, root, None)
    if algorithm == "tree_reduce":
        return rc.tree_reduce(t, root, "sum", None)
    if algorithm == "pairwise_all_to_all":
        return rc.pairwise_all_to_all(t.repeat(n), t.repeat(n), None)
    raise ValueError(f"unknown algorithm {algorithm!r}")


def torch_all_to_all_aliased(numel: int) -> int:
    """dist.all_to_all_single with output aliasing input; returns the number of wrong elements."""
    n, r = dist.get_world_size(), dist.get_rank()
    # Element i of rank q's input is q * 1000 + i; block j goes to rank j.
    t = torch.arange(n * numel, dtype=torch.float64) + r * 1000  # gloo only (suites/collectives/test_findings.py)
    dist.all_to_all_single(t, t)
    want = torch.cat([torch.arange(r * numel, (r + 1) * numel, dtype=torch.float64) + q * 1000 for q in range(n)])
    return int((t != want).sum())


def reference_error(call: str) -> str:
    """Call a reference collective with a bad argument; return the ValueError's message."""
    t = torch.zeros(6)
    n = dist.get_world_size()
    bad = {
        "reduce_scatter_sizes": lambda: rc.ring_reduce_scatter(torch.zeros(2), torch.zeros(2 * n + 1)),
        "all_gather_sizes": lambda: rc.ring_all_gather(torch.zeros(2 * n + 1), torch.zeros(2)),
        "all_to_all_sizes": lambda: rc.pairwise_all_to_all(torch.zeros(n * 2 + 1), torch.zeros(n * 2 + 1)),
        "non_contiguous": lambda: rc.ring_all_reduce(torch.zeros(4, 4).t()),
        "unknown_op": lambda: rc.ring_all_reduce(t, "median"),
        "bad_root": lambda: rc.tree_broadcast(t, n),
        "bad_algorithm": lambda: rc.ReferenceCollectives("butterfly"),
    }[call]
    try:
        bad()
    except ValueError as exc:
        return str(exc)
    return "no error"


def reference_avg_on_integers() -> str:
    try:
        rc.ring_all_reduce(torch.zeros(3, dtype=torch.int32), "avg")
    except rc.Unsupported as exc:
        return str(exc)
    return "no error"
