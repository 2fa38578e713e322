"""What every DeepSpeed path of the harness does first: DeepSpeed's environment over the World's group
(``init``), and the module-global ``deepspeed.utils.groups.mpu`` released: the sequence-parallel group the
Ulysses adapter registers there (``SequenceParallelGroup``) and the grid a ``PipelineEngine`` registers there
(every later engine would read the pipeline as its model-parallel group: ``mpu.get_model_parallel_rank`` of an
engine that has none)."""

from __future__ import annotations

import importlib
import os

import torch.distributed as dist


def init() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if dist.get_backend() == "nccl" else "cpu")
    # DeepSpeed reads its rank from the launcher's environment; the World already initialised the group.
    for key, value in (("RANK", dist.get_rank()), ("LOCAL_RANK", dist.get_rank()),
                       ("WORLD_SIZE", dist.get_world_size()), ("LOCAL_SIZE", dist.get_world_size())):
        os.environ[key] = str(value)
    import deepspeed

    # importlib, not "import deepspeed.comm.torch as ...": deepspeed.comm's attribute "torch" is torch itself
    ds_comm = importlib.import_module("deepspeed.comm.torch")
    if os.environ["DS_ACCELERATOR"] == "cpu":
        # DeepSpeed's CPU backend JIT-compiles its shared-memory all-reduce op (deepspeed_shm_comm) on first
        # init, 30-100 s per fresh machine. That op serves only ``inference_all_reduce``, which training
        # never calls (ZeRO's collectives go through torch.distributed): skip the build, nothing else changes.
        ds_comm.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
    release_mpu()  # a sequence-parallel group or a pipeline grid of an earlier call is not this engine's mpu


def release_mpu() -> None:
    """Unregister what an earlier call left in the module-global ``deepspeed.utils.groups.mpu`` (which
    DeepSpeed's engines read as a Megatron mpu): the Ulysses adapters' sequence-parallel group (ours, or
    DeepSpeed's ``parallel_state_sp`` an engine registered), a ``PipelineEngine``'s grid — and the (data,
    sequence) device mesh an engine with ``sequence_parallel_size`` leaves in ``groups.mesh_device`` (the next
    engine would take its sequence-parallel size). Every DeepSpeed entry point of this harness calls it first
    (through ``init``)."""
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid
    from deepspeed.utils import groups

    if isinstance(groups.mpu, (SequenceParallelGroup, PipelineParallelGrid)):
        groups.mpu = None
    if getattr(groups, "mesh_device", None) is not None:
        groups.mesh_device = None
    if getattr(groups.mpu, "__name__", "") == "deepspeed.runtime.sequence_parallel.parallel_state_sp":
        groups.mpu = None  # the Ulysses stack's engine registered DeepSpeed's own sequence-parallel state


class SequenceParallelGroup:
    """The part of Megatron-DeepSpeed's ``mpu`` DeepSpeed-Ulysses reads: its uneven-heads path takes this
    rank's place from ``deepspeed.utils.groups._get_sequence_parallel_rank()`` — 0 when no mpu or mesh is
    registered — not from the group ``DistributedAttention`` is given (the watch test shows that)."""

    def __init__(self, group):
        self.group = group

    def get_sequence_parallel_group(self):
        return self.group

    def get_sequence_parallel_rank(self):
        return dist.get_rank(self.group)

    def get_sequence_parallel_world_size(self):
        return dist.get_world_size(self.group)
