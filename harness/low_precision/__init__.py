"""Low-precision training (float8 tensorwise / rowwise, MXFP8): the linear-layer case over TP / SP / FSDP layouts
held to one device running the same recipe. Its ``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "low_precision", 11, contract="harness.contracts.low_precision:LowPrecision",
    builtins=(
        ImplSpec("reference", "low_precision", "reference.low_precision:ReferenceLowPrecision",
                 description="ours: emulated float8 / MXFP8 linear (TP column / row, SP, FSDP + float8 all-gather)"),
        ImplSpec("torchao", "low_precision", "harness.adapters.torchao.low_precision:TorchaoLowPrecision",
                 requires=("torchao",),
                 description="torchao float8 training, emulated (Float8Linear; DTensor TP; FSDP2 float8 all-gather)"),
    ),
    benches=(
        Bench("low_precision", "one linear layer per implementation, recipe (float8 tensorwise / rowwise, MXFP8) and "
                               "layout (FSDP with and without the float8 all-gather, TP): time and bytes per rank vs "
                               "the cost model", "harness.low_precision.cli:plans",
              "harness.low_precision.cli:add_arguments", in_all=7),
    ),
    sections=(Section(65, "harness.low_precision.bench:low_precision_section", suite="low_precision"),),
)
