"""Collectives: the exact case, the nccl-tests-style sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "collectives", 2, contract="harness.contracts.collectives:Collectives",
    builtins=(
        ImplSpec("reference", "collectives", "reference.collectives:ReferenceCollectives",
                 {"all_reduce_algorithm": "ring"}, description="ours, p2p only; ring all-reduce"),
        ImplSpec("reference-rhd", "collectives", "reference.collectives:ReferenceCollectives",
                 {"all_reduce_algorithm": "rhd"}, only_ops=("all_reduce",),
                 description="ours; recursive halving/doubling all-reduce"),
        ImplSpec("reference-tree", "collectives", "reference.collectives:ReferenceCollectives",
                 {"all_reduce_algorithm": "tree"}, only_ops=("all_reduce",),
                 description="ours; binomial tree reduce + broadcast"),
        ImplSpec("reference-naive", "collectives", "reference.collectives:ReferenceCollectives",
                 {"all_reduce_algorithm": "naive"}, only_ops=("all_reduce",),
                 description="ours; central root all-reduce"),
        ImplSpec("torch", "collectives", "harness.adapters.torch.collectives:TorchCollectives",
                 requires=("torch",), description="native torch.distributed on the current backend"),
    ),
    findings=FINDINGS,
    benches=(
        Bench("collectives", "nccl-tests-style size sweep of every collective",
              "harness.collectives.cli:plans", "harness.collectives.cli:add_arguments", in_all=1),
    ),
    sections=(Section(20, "harness.collectives.report:collectives_section", suite="collectives"),),
    headlines="harness.collectives.report:headlines",
)
