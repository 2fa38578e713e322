"""The dense state's one exchange (``harness.stack.dense.full_tensors``, ``exchanged``) gives what each DTensor's own
``full_tensor()`` gives, bitwise, on the placements the stacks make: FSDP2 (Shard), FSDP2 over TP (torch's strided
shard), HSDP (Replicate x Shard), TP alone, rows the mesh does not divide, Adam's state — and falls back to
``full_tensor()`` where torch does not describe a shard as one box (a partial placement; a torch without the
protocol), on every rank alike."""

from __future__ import annotations

import pytest

N = 4


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    # 6 rows over tp 2 then dp 2: 3 rows a TP shard, split 2 / 1 by FSDP — the mesh does not divide them
    return torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.ReLU(), torch.nn.Linear(6, 10))


def _sharded(kind: str):
    """A model sharded as ``kind`` on the World's 4 ranks (on their device: the CPU on gloo), one Adam step taken: its
    parameters' and Adam state's tree."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from harness.runtime.rank import rank_device

    device = rank_device()
    model = _model(0).to(device)
    if kind == "fsdp":
        fully_shard(model, mesh=init_device_mesh(device.type, (N,)))
    elif kind.startswith("hsdp"):
        fully_shard(model, mesh=init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard")))
    else:
        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        if kind == "fsdp-tp":
            fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    model(torch.randn(3, 10).to(device)).square().sum().backward()
    opt.step()
    if kind == "hsdp-drifted":  # the second replica's copy off by one: each rank's full tensor is its replica's
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().add_(p.device_mesh.get_coordinate()[0])
    return {"params": {n: p.detach() for n, p in model.named_parameters()},
            "optimizer": {n: {k: opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")}
                          for n, p in model.named_parameters()}}


def _flat(tree: dict, path=()) -> dict:
    """{path: leaf} of a tree of dicts."""
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, (*path, k)) if isinstance(v, dict) else {(*path, k): v})
    return out


def compare(kind: str, without_protocol: bool = False) -> dict:
    """Rank side: where ``full_tensors`` differs from ``full_tensor()`` (path, dtype, bits), and how many
    ``full_tensor()`` calls it made (0: the one exchange served every DTensor)."""
    import torch
    from torch.distributed.tensor import DTensor

    from harness.stack.dense import full_tensors

    tree = _sharded(kind)
    if kind == "partial":  # a pending sum: the protocol refuses it
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Partial

        from harness.runtime.rank import rank_device

        mesh = init_device_mesh(rank_device().type, (N,))
        tree["pending"] = DTensor.from_local(torch.arange(6.0, device=rank_device()) * (1 + mesh.get_rank()), mesh,
                                             [Partial()])
    own = _flat(tree)
    expected = {path: (t.full_tensor() if isinstance(t, DTensor) else t).cpu() for path, t in own.items()}
    calls = []
    original = DTensor.full_tensor
    patched = {"full_tensor": lambda self, **kw: calls.append(1) or original(self, **kw)}
    saved = DTensor.__dict__.get("__create_chunk_list__")
    if without_protocol:
        patched["__create_chunk_list__"] = property(lambda self: (_ for _ in ()).throw(AttributeError("absent")))
    for name, value in patched.items():
        setattr(DTensor, name, value)
    try:
        got = full_tensors(tree)
    finally:
        DTensor.full_tensor = original
        if without_protocol:
            DTensor.__create_chunk_list__ = saved
    flat = _flat(got)
    off = [f"{path}: {flat.get(path)!r} against {t!r}" for path, t in expected.items()
           if path not in flat or flat[path].dtype != t.dtype or flat[path].device.type != "cpu"
           or not torch.equal(flat[path], t)]
    placements = sorted({str(t.placements) for t in own.values() if isinstance(t, DTensor)})
    return {"off": off, "calls": len(calls), "placements": placements, "entries": len(flat)}


@pytest.mark.parametrize("kind, placements", [
    ("fsdp", "(Shard(dim=0),)"),
    ("fsdp-tp", "_StridedShard"),
    ("hsdp", "(Replicate(), Shard(dim=0))"),
    ("hsdp-drifted", "(Replicate(), Shard(dim=0))"),
    ("tp", "(Shard(dim=1),)"),
])
def test_one_exchange_equals_each_dtensor_s_own_full_tensor(kind, placements, world_cache):
    per_rank = world_cache.get(N).run(compare, kind, timeout=120)
    for rank, got in enumerate(per_rank):
        assert got["off"] == [], (rank, got["off"][:3])
        assert got["entries"] == 12 and got["calls"] == 0, (rank, got)  # 4 tensors x (value, exp_avg, exp_avg_sq)
        assert any(placements in p for p in got["placements"]), got["placements"]  # the layout it claims to test


@pytest.mark.parametrize("kind, without_protocol, calls", [("partial", False, 1), ("fsdp-tp", True, 12)])
def test_what_the_exchange_cannot_box_is_gathered_by_full_tensor_on_every_rank(kind, without_protocol, calls,
                                                                               world_cache):
    """The fallback: a partial DTensor (the protocol raises for it) alone, or every DTensor where the protocol is
    absent (as on a torch that moved it) — each by its own ``full_tensor()``, the same answer."""
    per_rank = world_cache.get(N).run(compare, kind, without_protocol, timeout=120)
    assert all(got["off"] == [] and got["calls"] == calls for got in per_rank), per_rank


def bytes_round_trip() -> list:
    """Rank side: ``exchanged`` of tensors of several dtypes and shapes, one object under two names."""
    import torch
    import torch.distributed as dist

    from harness.stack.dense import exchanged

    r = dist.get_rank()
    shared = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) + r
    mine = {"a": shared, "b": shared, "scalar": torch.tensor(3.5 + r), "empty": torch.zeros(0, 4, dtype=torch.int64),
            "t": (torch.ones(2, dtype=torch.bool), 7, None), "strided": torch.arange(12.0).reshape(3, 4).t()}
    out = []
    for k, got in enumerate(exchanged(mine)):
        want = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) + k, "scalar": torch.tensor(3.5 + k),
                "empty": torch.zeros(0, 4, dtype=torch.int64), "strided": torch.arange(12.0).reshape(3, 4).t()}
        for name, t in want.items():
            if got[name].dtype != t.dtype or not torch.equal(got[name], t):
                out.append(f"rank {k} {name}: {got[name]!r}")
        if got["a"] is not got["b"]:
            out.append(f"rank {k}: one tensor under two names came back as two")
        if got["t"][1:] != (7, None) or not torch.equal(got["t"][0], torch.ones(2, dtype=torch.bool)):
            out.append(f"rank {k} t: {got['t']!r}")
    return out


def test_the_exchange_sends_tensors_as_their_bytes_and_keeps_a_tensor_named_twice_one(world_cache):
    assert world_cache.get(N).run(bytes_round_trip, timeout=60) == [[]] * N
