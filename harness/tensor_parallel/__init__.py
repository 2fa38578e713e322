"""Tensor parallelism: the layer cases, the per-layer sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "tensor_parallel", 4, contract="harness.contracts.tensor_parallel:TensorParallel",
    builtins=(
        ImplSpec("reference", "tensor_parallel", "reference.tensor_parallel.adapter:ReferenceTensorParallel",
                 description="ours: Megatron-style conjugate operators"),
        ImplSpec("torch", "tensor_parallel", "harness.adapters.torch.tensor_parallel:TorchTensorParallel",
                 requires=("torch.distributed.tensor.parallel",),
                 description="DTensor parallelize_module: ColwiseParallel / RowwiseParallel"),
        ImplSpec("megatron", "tensor_parallel", "harness.adapters.megatron.tensor_parallel:MegatronTensorParallel",
                 requires=("megatron.core",), description="megatron-core tensor_parallel layers on CPU/gloo"),
    ),
    findings=FINDINGS,
    benches=(
        Bench("tensor_parallel", "forward+backward time and bytes per sharded layer",
              "harness.tensor_parallel.cli:plans", "harness.tensor_parallel.cli:add_arguments"),
    ),
    sections=(Section(30, "harness.tensor_parallel.report:tensor_parallel_section", suite="tensor_parallel"),),
)
