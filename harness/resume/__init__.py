"""Resume: save and load of the 3D stack's state across layouts (``paritybench bench resume``) and its report section.
Its ``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section

PARADIGM = Paradigm(
    "resume", 10,
    benches=(
        Bench("resume", "save and load time, GB/s and bytes per rank of the 3D stack's state",
              "harness.resume.cli:plans", iters=3, warmup=1),
    ),
    sections=(Section(90, "harness.resume.bench:resume_section", suite="resume"),),
)
