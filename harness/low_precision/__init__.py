"""Low-precision training (float8 tensorwise / rowwise, MXFP8): the linear-layer case over TP / SP / FSDP layouts
held to one device running the same recipe. Its ``PARADIGM`` record is what the shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec
from harness.records.releases import TORCHTITAN_03

PARADIGM = Paradigm(
    "low_precision", 11, contract="harness.contracts.low_precision:LowPrecision",
    builtins=(
        ImplSpec("reference", "low_precision", "reference.low_precision:ReferenceLowPrecision",
                 description="ours: emulated float8 / MXFP8 linear (TP column / row, SP, FSDP + float8 all-gather)"),
        ImplSpec("torchao", "low_precision", "harness.adapters.torchao.low_precision:TorchaoLowPrecision",
                 requires=("torchao",),
                 description="torchao float8 and MXFP8 training, emulated (Float8Linear, MXFP8Linear; DTensor TP; "
                             "FSDP2 float8 all-gather)"),
        ImplSpec("torchtitan", "low_precision", "harness.adapters.torchtitan.low_precision:TorchtitanLowPrecision",
                 requires=("torchtitan", "torchao", "spmd_types"), drives=TORCHTITAN_03,
                 description="torchtitan's float8 converter, emulated (its torchao config; TP and FSDP2 as it applies "
                             "them)"),
    ),
    findings=(
        Finding("torchao", "low_precision", "torchao", ("0.18.0", None),
                "torchao's FSDP2 float8 all-gather with precomputed scales (precompute_float8_dynamic_scale_for_fsdp, "
                "its documented use) deadlocks when the weight's rows do not divide over the shard group: the scale is "
                "set on each rank's local tensor, but a rank whose shard FSDP2 pads all-gathers from a padded copy "
                "without it, casts dynamically and all-reduces an amax its peers never join (minimal case: a 33 x 21 "
                "weight over dp 2; without the precompute the padded rank aborts in gloo with a collective size "
                "mismatch instead — torchao #3982's kind).",
                "suites/low_precision/test_torchao.py::test_watch_float8_all_gather_of_rows_dp_does_not_divide_hangs",
                {"fp8_all_gather": True, "rows_remainder": lambda r: r != 0},
                symptom=r"never entered (all_gather_single|all_reduce)", hangs=True),
        Finding("torchtitan", "low_precision", "torchtitan", ("0.3.0", None),
                "torchtitan's Float8LinearConverter with emulate=True (its only mode without an SM89 GPU) replaces the "
                "recipe's config by torchao's default, Float8LinearConfig(emulate=True) — tensorwise scaling — and "
                "still logs 'Float8 training active with recipe rowwise': asked rowwise, it trains tensorwise (every "
                "operand's scale from the whole tensor's amax, not its row's; minimal case: a 32 x 32 linear layer on "
                "one rank, off by 1.4e7 u32 of the rowwise recipe's magnitude, bound 36).",
                "suites/low_precision/test_torchtitan.py::test_watch_torchtitans_emulated_rowwise_float8_is_tensorwise",
                {"recipe": "float8-rowwise"}, symptom=r"u32 of its magnitude"),
        Finding("torchao", "low_precision", "torchao", ("0.18.0", None),
                "torchao's MXFP8 training config (quantize_ with MXFP8TrainingOpConfig, its weight wrapper) applied "
                "before tensor parallelism — the order its float8 conversion takes — trains the TP linear in fp32 "
                "without a word: DTensor wraps the wrapper, whose __torch_function__ never sees the linear (ao PR "
                "4010 made the other order, MXFP8 over DTensor, work). Minimal case: a 64 x 64 column-parallel "
                "linear over tp 2, its output the fp32 GEMM's, far off the MXFP8 recipe's.",
                "suites/low_precision/test_torchao.py::test_watch_mxfp8_op_config_before_tp_trains_in_fp32",
                handled_by_adapter="the adapter builds torchao's MXFP8Linear (what torchtitan's converter builds), "
                                   "whose forward runs the MXFP8 GEMMs on DTensors too"),
    ),
    benches=(
        Bench("low_precision", "one linear layer per implementation, recipe (float8 tensorwise / rowwise, MXFP8) and "
                               "layout (FSDP with and without the float8 all-gather, TP): time and bytes per rank vs "
                               "the cost model", "harness.low_precision.cli:plans",
              "harness.low_precision.cli:add_arguments", in_all=7,
              own_world_size="each layout runs on its own 2 ranks (FSDP over 2, or TP over 2)", warmup=2),
    ),
    sections=(Section(65, "harness.low_precision.bench:low_precision_section", suite="low_precision"),),
)
