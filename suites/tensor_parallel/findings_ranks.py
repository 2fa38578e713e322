"""Rank side of test_findings.py: the minimal cases of third-party behaviour this suite found."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.tensor_parallel.layer_case import _block, _dense_linear, _ints


def dtensor_row_bias(in_features: int, bias: bool) -> float:
    """Max |DTensor RowwiseParallel - dense| for integer weights and inputs (exact in float64)."""

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    n = dist.get_world_size()
    dense = _dense_linear(in_features, 4, 0, torch.float64)
    if not bias:
        dense.bias = None
    row = parallelize_module(copy.deepcopy(dense), DeviceMesh.from_group(dist.group.WORLD, "cpu"), RowwiseParallel())
    x = _ints((1, 1, dense.in_features), 2, -3, 3)
    block = _block(dense.in_features, n, dist.get_rank())
    return float((row(x[..., block]) - dense(x)).abs().max())


def dtensor_size_one() -> None:
    """ColwiseParallel of Linear(1, 1) with bias on this (1-rank) mesh, forward and backward."""

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    col = parallelize_module(copy.deepcopy(torch.nn.Linear(1, 1, dtype=torch.float64)),
                             DeviceMesh.from_group(dist.group.WORLD, "cpu"), ColwiseParallel())
    col(torch.ones(1, 1, 1, dtype=torch.float64, requires_grad=True)).sum().backward()


def dtensor_empty_vocab_shard() -> None:
    """RowwiseParallel of nn.Embedding(4, 2) over 3 ranks (torch.chunk: 2, 2, 0 rows), one lookup."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    emb = parallelize_module(torch.nn.Embedding(4, 2, dtype=torch.float64),
                             DeviceMesh.from_group(dist.group.WORLD, "cpu"), RowwiseParallel())
    emb(torch.tensor([[0, 3]]))


def megatron_cross_entropy(vocab: int) -> dict:
    """megatron-core's vocab_parallel_cross_entropy on float64 logits: the dtype it returns, and its loss
    vs F.cross_entropy when the vocabulary is padded to a multiple of the TP size with zero logits (as
    its training pads the output layer), for one token whose logits are 0..V-1."""
    from megatron.core import tensor_parallel

    from harness.adapters.megatron.tensor_parallel import _config, _padded

    n, r = dist.get_world_size(), dist.get_rank()
    _config(n, torch.float64, False)
    padded = _padded(vocab, n)
    full = torch.zeros(1, 1, padded, dtype=torch.float64)
    full[..., :vocab] = torch.arange(vocab, dtype=torch.float64)
    per = padded // n
    loss = tensor_parallel.vocab_parallel_cross_entropy(full[..., r * per:(r + 1) * per].clone(), torch.tensor([[0]]))
    want = F.cross_entropy(full[0, :, :vocab], torch.tensor([0]))
    return {"dtype": str(loss.dtype), "loss": float(loss), "dense": float(want)}


def ddp_over_tp() -> dict:
    """torch's DistributedDataParallel over a tensor-parallel module by its 2-D path (``device_mesh``: the dp
    dimension of a (dp 2, tp 2) mesh, whereupon DDP localises the DTensor parameters itself): the module's parameter
    names and state_dict keys before DDP wraps it and after two SGD steps, and the largest difference of its output
    on the whole batch from one device's then (integer weights and inputs, lr 2^-6, each replica's half of the batch:
    every value a binary fraction, so any difference is a real one — exact comparison)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    dense = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(8, 4, bias=False)).double()
    with torch.no_grad():
        for i, p in enumerate(dense.parameters()):
            p.copy_(_ints(p.shape, 10 + i, -2, 2))
    x = _ints((4, 4), 20, -2, 2)
    model = copy.deepcopy(dense)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out = {"names_before": [n for n, _ in model.named_parameters()]}
    ddp = DistributedDataParallel(model, device_mesh=mesh["dp"])
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=2.0 ** -6) for m in (ddp, dense))
    half = x[2 * mesh.get_local_rank("dp"):][:2]
    for _ in range(2):
        opt.zero_grad()
        ddp(half).pow(2).sum().backward()  # RowwiseParallel: the whole output, local; DDP averages the replicas
        opt.step()
        ref_opt.zero_grad()
        (dense(x).pow(2).sum() / 2).backward()
        ref_opt.step()
    out["names_after"] = [n for n, _ in model.named_parameters()]
    out["state_dict_after"] = list(model.state_dict())
    with torch.no_grad():  # the trained model's output on the whole batch: its weights are what it computes with
        out["off"] = float((model(x) - dense(x)).abs().max())
    return out


def scaler_found_inf(replicated_first: bool) -> dict:
    """torch's GradScaler over DTensor parameters on a tp mesh of 2 ranks: a replicated one (a sequence-parallel
    norm's weight) and a row-sharded one (a ColwiseParallel weight) whose gradient overflows on the second rank's
    rows alone (its upstream factor 2^120, times the scale 2^16: past float32's 2^128; the replicated gradient and
    the first rank's rows finite, every value a power of two). One device takes the whole gradient, finds the inf,
    skips the step and halves the scale. Returns, per rank, whether it stepped, its scale after ``update()`` and
    its copy of the replicated parameter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    norm = torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Replicate()]))
    proj = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]))
    upstream = torch.ones(4, 4)
    upstream[2:] = 2.0 ** 120  # the second rank's rows of the sharded weight
    upstream = distribute_tensor(upstream, mesh, [Shard(0)])
    opt = torch.optim.SGD([norm, proj] if replicated_first else [proj, norm], lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    loss = (norm * norm).sum() + (proj * upstream).sum()
    scaler.scale(loss.full_tensor()).backward()
    scaler.step(opt)
    scaler.update()
    return {"stepped": bool((norm.to_local() != 1.0).any()), "scale": float(scaler.get_scale()),
            "norm": norm.to_local().tolist()}
