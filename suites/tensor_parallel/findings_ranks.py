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
