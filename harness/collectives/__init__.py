"""Collectives: the exact case, the nccl-tests-style sweep and its report section. Its ``PARADIGM`` record is what the
shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding
from harness.records.registry import ImplSpec

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
    findings=(
        Finding("torch", "collectives", "torch", ("2.13", None),
                "torch.distributed.all_to_all_single with the output aliasing the input returns blocks in the wrong "
                "places on gloo, silently and intermittently (16 of 20 calls wrong at 1 element per block, 2 ranks).",
                "suites/collectives/test_findings.py::test_torch_all_to_all_single_in_place_still_corrupts",
                handled_by_adapter="the torch adapter declares in-place all_to_all unsupported"),
    ),
    benches=(
        Bench("collectives", "nccl-tests-style size sweep of every collective",
              "harness.collectives.cli:plans", "harness.collectives.cli:add_arguments", in_all=1),
    ),
    sections=(Section(20, "harness.collectives.report:collectives_section", suite="collectives"),),
    headlines="harness.collectives.report:headlines",
)
