"""Expert parallelism (MoE): the layer case, the token and skew sweep and its report section.

``PARADIGM`` is all the shared tools (the CLI, the report, the registries) know of it (``harness.paradigm``)."""

from __future__ import annotations

from harness.records.registry import ImplSpec
from harness.records.releases import TORCHTITAN_03

from ..paradigm import Bench, Paradigm, Section
from .findings import FINDINGS

PARADIGM = Paradigm(
    "expert_parallel", 8, contract="harness.contracts.expert_parallel:ExpertParallel",
    builtins=(
        ImplSpec("reference", "expert_parallel", "reference.expert_parallel:ReferenceExpertParallel",
                 description="ours: all-to-all dispatch with variable splits, expert-data-parallel reduction"),
    ),
    options=(("transformers", "transformers"),),
    third_party=(  # timed by its bench beside the registered ones; held to one device by their own reports
        ImplSpec("deepspeed-moe", "expert_parallel", "harness.adapters.deepspeed.moe:DeepSpeedMoE",
                 requires=("deepspeed",)),
        ImplSpec("megatron-moe", "expert_parallel", "harness.adapters.megatron.moe:MegatronMoE",
                 requires=("megatron.core",)),
        ImplSpec("torchtitan-moe", "expert_parallel", "harness.adapters.torchtitan.moe:TorchtitanMoE",
                 requires=("torchtitan", "spmd_types"), drives=TORCHTITAN_03),
    ),
    findings=FINDINGS,
    benches=(
        Bench("expert_parallel", "one MoE layer per implementation vs ep, tokens and skew: time, dispatch "
                                 "time and bytes per rank vs the cost model",
              "harness.expert_parallel.cli:plans", "harness.expert_parallel.cli:add_arguments"),
    ),
    sections=(Section(60, "harness.expert_parallel.bench:expert_parallel_section", suite="expert_parallel"),),
)
