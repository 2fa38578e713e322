"""Pipeline parallelism: the equivalence case, the schedule sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "pipeline", 3, contract="harness.contracts.pipeline:Pipeline",
    builtins=(
        ImplSpec("reference", "pipeline", "reference.pipeline.runtime:ReferencePipeline",
                 description="ours: one interpreter of schedules-as-data"),
        ImplSpec("torch", "pipeline", "harness.adapters.torch.pipeline:TorchPipeline",
                 requires=("torch.distributed.pipelining",),
                 description="torch.distributed.pipelining schedules with PipelineStage"),
    ),
    findings=FINDINGS,
    benches=(
        Bench("pipeline", "step time and bubble per schedule, measured vs simulated",
              "harness.pipeline.cli:plans", "harness.pipeline.cli:add_arguments", in_all=2, calibrated=True,
              iters=5, warmup=2),
    ),
    sections=(Section(110, "harness.pipeline.report:pipeline_section", suite="pipeline"),),
)
