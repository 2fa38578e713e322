"""Expert parallelism (MoE): the layer case, the token and skew sweep and its report section. Its ``PARADIGM`` record
is what the shared tools read."""

from harness.records.findings import Finding
from harness.records.registry import ImplSpec
from harness.records.releases import TORCHTITAN_03

from ..paradigm import Bench, Paradigm, Section

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
    findings=(
        Finding("megatron", "expert_parallel", "megatron-core", ("0.15.3", "0.17.1"),
                "megatron-core's MoE router does not run without TransformerEngine: moe_utils imports te_general_gemm "
                "in a try whose except ImportError defines nothing, and RouterGatingLinearFunction tests "
                "'te_general_gemm is not None' on every forward (NameError; minimal case: any MoELayer forward where "
                "TE is not installed).",
                "suites/expert_parallel/test_megatron_moe.py::test_watch_megatrons_router_needs_transformer_engine",
                handled_by_adapter="the megatron MoE adapter defines moe_utils.te_general_gemm = None where the import "
                                   "failed"),
        Finding("transformers", "expert_parallel", "transformers", ("5.20.2", "5.23.0"),
                "transformers' expert parallelism over FSDP with as many ranks as experts' groups (ep 2 over 2 ranks) "
                "halves the experts' gradients (gate_up_proj and down_proj off by 0.5 of their magnitude; the loss and "
                "every other gradient right; ep 2 over 4 ranks right) — minimal case: a Qwen3-MoE of 4 experts, top-2, "
                "float32; right at 5.23.0.",
                "suites/expert_parallel/test_transformers_ep.py::test_watch_transformers_ep_halves_expert_gradients",
                {"ep": 2, "n": 2},
                symptom=r"gradient model\.layers\.\d+\.mlp\.experts\.(down_proj|gate_up_proj): off by 0\.5 of its "
                        r"magnitude"),
    ),
    benches=(
        Bench("expert_parallel", "one MoE layer per implementation vs ep, tokens and skew: time, dispatch "
                                 "time and bytes per rank vs the cost model",
              "harness.expert_parallel.cli:plans", "harness.expert_parallel.cli:add_arguments", iters=5, warmup=1),
    ),
    sections=(Section(60, "harness.expert_parallel.bench:expert_parallel_section", suite="expert_parallel"),),
)
