"""Muon under sharding (#42's first part): an optimizer stepping a small model's matrices with Muon and the rest with
AdamW over a layout that shards them, held to one device running torch's Muon. Its ``PARADIGM`` record is what the
shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "muon", 12, contract="harness.contracts.muon:Muon",
    builtins=(
        ImplSpec("reference", "muon", "reference.muon:ReferenceMuon",
                 description="ours: Muon + AdamW, each matrix gathered and orthogonalised whole per logical part "
                             "(replicated, rows, cols, flat ZeRO shards)"),
        ImplSpec("torch", "muon", "harness.adapters.torch.muon:TorchMuon",
                 description="torch.optim.Muon + AdamW on DTensor parameters (Shard(0) as FSDP2 / a column-parallel "
                             "layer, Shard(1) as a row-parallel layer)"),
    ),
    benches=(
        Bench("muon", "one Muon + AdamW step per implementation, layout (replicated, rows, cols, flat) and world size: "
                      "time and bytes per rank vs the cost model", "harness.muon.cli:plans",
              "harness.muon.cli:add_arguments", in_all=8, iters=5, warmup=1),
    ),
    sections=(Section(67, "harness.muon.bench:muon_section", suite="muon"),),
)
