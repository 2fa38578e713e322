"""Pipeline parallelism: the equivalence case, the schedule sweep and its report section. Its ``PARADIGM`` record is
what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "pipeline", 3, contract="harness.contracts.pipeline:Pipeline",
    builtins=(
        ImplSpec("reference", "pipeline", "reference.pipeline.runtime:ReferencePipeline",
                 description="ours: one interpreter of schedules-as-data"),
        ImplSpec("torch", "pipeline", "harness.adapters.torch.pipeline:TorchPipeline",
                 requires=("torch.distributed.pipelining",),
                 description="torch.distributed.pipelining schedules with PipelineStage"),
    ),
    findings=(
        Finding("torch", "pipeline", "torch", ("2.13", None),
                "torch.distributed.pipelining raises on unequal microbatches (a batch of 7 in 2 microbatches), while "
                "the contract splits with tensor_split.",
                "suites/pipeline/test_findings.py::test_torch_pipelining_still_raises_on_unequal_microbatches",
                handled_by_adapter="the torch pipeline adapter declares unequal microbatches unsupported"),
    ),
    benches=(
        Bench("pipeline", "step time and bubble per schedule, measured vs simulated",
              "harness.pipeline.cli:plans", "harness.pipeline.cli:add_arguments", in_all=2, calibrated=True,
              iters=5, warmup=2),
    ),
    sections=(Section(110, "harness.pipeline.report:pipeline_section", suite="pipeline"),),
)
