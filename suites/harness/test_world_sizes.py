"""World sizes default to ``auto``: 1-4 on CPU, up to the GPU count on a GPU node (1, 2, 3, the powers of
two and the count; benchmarks from 2), the job's size under torchrun."""

from __future__ import annotations

import pytest
import torch

from harness.cli.parsing import auto_world_sizes, device_world_sizes, parse_world_sizes
from harness.errors import UsageError


@pytest.mark.parametrize("devices, sizes", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 3, 4]),
                                            (6, [1, 2, 3, 4, 6]), (8, [1, 2, 3, 4, 8]),
                                            (16, [1, 2, 3, 4, 8, 16])])
def test_device_world_sizes(devices, sizes):
    assert device_world_sizes(devices) == sizes


def test_auto_on_a_cpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_world_sizes("auto", None, "1,2,3,4") == [1, 2, 3, 4]
    assert parse_world_sizes("auto", "gloo", "2,4", minimum=2) == [2, 4]
    assert parse_world_sizes("3,5") == [3, 5]
    with pytest.raises(UsageError, match="--backend nccl needs CUDA devices, and none is visible here"):
        auto_world_sizes("nccl", "2,4")


@pytest.mark.parametrize("backend", [None, "nccl"])
def test_auto_on_a_node_with_eight_gpus(monkeypatch, backend):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert auto_world_sizes(backend, "1,2,3,4") == [1, 2, 3, 4, 8]
    assert auto_world_sizes(backend, "2,4", minimum=2) == [2, 3, 4, 8]
    assert auto_world_sizes("gloo", "2,4") == [2, 4]  # gloo asked for: the CPU default, GPUs or not


def test_auto_on_a_node_with_one_gpu_benchmarks_one_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert auto_world_sizes("nccl", "2,4", minimum=2) == [1]
