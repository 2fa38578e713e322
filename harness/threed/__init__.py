"""The reference stack's 3D sweep (``paritybench bench 3d``): every layout with the bf16 / clip variants and the
measured bubble, and its report section. Its ``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section

PARADIGM = Paradigm(
    "3d", 9,
    benches=(
        Bench("3d", "the reference stack's GPT per layout with the bf16 / clip variants and the measured bubble",
              "harness.threed.cli:plans", "harness.threed.cli:add_arguments", calibrated=True,
              own_world_size="its layouts' world size is --3d-world-size (8)", iters=5, warmup=1),
    ),
    sections=(Section(80, "harness.threed.report:threed_section", suite="3d"),),
)
