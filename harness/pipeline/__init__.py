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
        Finding("torch", "pipeline", "torch", ("2.12", "2.13"),
                "torch.distributed.pipelining's split backward (stage_backward_input / stage_backward_weight: "
                "zb-h1, interleaved-zb, zbv, dualpipev) counts a weight's gradient twice when the weight is used "
                "twice on one path inside a stage other than the first (pytorch #180952, fixed in 2.13 by PR "
                "181365); minimal: p=2, m=2, the last stage applying one Linear twice.",
                "suites/pipeline/test_findings.py::test_torch_split_backward_double_counts_a_weight_used_twice",
                condition={"schedule": lambda s: s in ("zb-h1", "interleaved-zb", "zbv", "dualpipev"),
                           "shared": "stage"},
                symptom=r"^(step-\d+ loss |step-1 gradient of parameter \d+: max diff|parameters after \d+ steps)"),
    ),
    benches=(
        Bench("pipeline", "step time and bubble per schedule, measured vs simulated",
              "harness.pipeline.cli:plans", "harness.pipeline.cli:add_arguments", in_all=2, calibrated=True,
              iters=5, warmup=2),
    ),
    sections=(Section(110, "harness.pipeline.report:pipeline_section", suite="pipeline"),),
)
