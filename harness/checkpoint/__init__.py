"""Activation checkpointing: the case, the benchmark and the report section of ``paritybench bench checkpoint``.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "checkpoint", 1, contract="harness.contracts.checkpoint:Checkpointing",
    builtins=(
        ImplSpec("reference", "checkpoint", "reference.checkpoint:ReferenceCheckpointing",
                 description="ours: an autograd function that restores the RNG state"),
        ImplSpec("torch", "checkpoint", "harness.adapters.torch.checkpoint:TorchCheckpointing",
                 description="torch.utils.checkpoint, use_reentrant=False"),
        ImplSpec("torch-reentrant", "checkpoint", "harness.adapters.torch.checkpoint:TorchCheckpointing",
                 {"use_reentrant": True}, description="torch.utils.checkpoint, use_reentrant=True"),
    ),
    findings=FINDINGS,
    benches=(
        Bench("checkpoint", "activation memory and step time with and without checkpointing",
              "harness.checkpoint.cli:plans", "harness.checkpoint.cli:add_arguments", in_all=4),
    ),
    sections=(Section(100, "harness.checkpoint.report:checkpoint_section", suite="checkpoint"),),
)
