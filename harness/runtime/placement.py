"""Where each rank ran: host, node, local rank and device, recorded in ``run.json``.

A World's ranks are spawned on this host (node 0, local rank = rank). Under torchrun (multi-node) each
rank reports torchrun's ``GROUP_RANK`` (its node) and ``LOCAL_RANK``, so a run folder says how many
nodes took part and which rank ran where. Hostnames are recorded as given; with
``PARITYBENCH_HASH_HOSTS=1`` as the first 12 hex digits of their SHA-256 (for results published
outside the cluster).
"""

from __future__ import annotations

import hashlib
import os
import socket


def _host() -> str:
    name = socket.gethostname()
    if os.environ.get("PARITYBENCH_HASH_HOSTS", "") not in ("", "0"):
        return "sha256:" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return name


def rank_placement() -> dict:
    """Rank side: this rank's place (a module-level function, so a World can call it)."""
    import torch.distributed as dist

    from harness.runtime.rank import rank_device

    rank = dist.get_rank()
    return {"rank": rank, "host": _host(), "node": int(os.environ.get("GROUP_RANK", 0)),
            "local_rank": int(os.environ.get("LOCAL_RANK", rank)), "device": str(rank_device()),
            "backend": dist.get_backend()}


def summarize(places: list[dict]) -> dict:
    """run.json fields for one World: nodes (distinct (node, host) pairs), hosts, and the rank table."""
    nodes = sorted({(p["node"], p["host"]) for p in places})
    return {"nodes": len(nodes), "hosts": sorted({p["host"] for p in places}), "ranks": places}


def record(run, world) -> None:
    """Add ``world``'s placement to ``run``'s run.json under ``placement[<world size>]``; ``nodes`` and
    ``hosts`` at the top level are the most any World of the run used."""
    if run is None:
        return
    info = summarize(world.run(rank_placement))
    run.update(**merged(run.meta, {"placement": {str(world.size): info}, "hosts": info["hosts"],
                                   "backends": sorted({p["backend"] for p in info["ranks"]}),
                                   "nodes": info["nodes"], "launcher": launcher()}))


def merged(meta: dict, other: dict) -> dict:
    """The placement fields of run.json ``meta`` with ``other``'s (another World's, a pytest-xdist worker's,
    another run's) added: placement per world size, hosts and backends united, the most nodes, the launcher."""
    return {"placement": {**meta.get("placement", {}), **other.get("placement", {})},
            "hosts": sorted(set(meta.get("hosts", [])) | set(other.get("hosts", []))),
            "backends": sorted(set(meta.get("backends", [])) | set(other.get("backends", []))),
            "nodes": max(meta.get("nodes", 0), other.get("nodes", 0)),
            "launcher": other.get("launcher", meta.get("launcher", "world"))}


def launcher() -> str:
    """"torchrun" when this process drives a torchrun job (harness.runtime.spmd), else "world" (spawned ranks)."""
    from harness.runtime import spmd_runtime as spmd

    return "torchrun" if spmd.active() else "world"
