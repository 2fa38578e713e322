"""Tensor parallelism: the layer cases, the per-layer sweep and its report section. Its ``PARADIGM`` record is what the
shared tools read."""

from harness.paradigm import Bench, Paradigm, Section
from harness.records.findings import Finding, not_power_of_two
from harness.records.registry import ImplSpec

PARADIGM = Paradigm(
    "tensor_parallel", 4, contract="harness.contracts.tensor_parallel:TensorParallel",
    builtins=(
        ImplSpec("reference", "tensor_parallel", "reference.tensor_parallel.adapter:ReferenceTensorParallel",
                 description="ours: Megatron-style conjugate operators"),
        ImplSpec("torch", "tensor_parallel", "harness.adapters.torch.tensor_parallel:TorchTensorParallel",
                 requires=("torch.distributed.tensor.parallel",),
                 description="DTensor parallelize_module: ColwiseParallel / RowwiseParallel"),
        ImplSpec("megatron", "tensor_parallel", "harness.adapters.megatron.tensor_parallel:MegatronTensorParallel",
                 requires=("megatron.core",), description="megatron-core tensor_parallel layers on CPU/gloo"),
    ),
    findings=(
        Finding("torch", "tensor_parallel", "torch", ("2.6", None),
                "DTensor RowwiseParallel adds bias / n on each of n ranks to a Partial output: it rounds when the "
                "mesh size is not a power of two (minimal case: tp=3, Linear(3, 4), integer weights and inputs).",
                "suites/tensor_parallel/test_findings.py::test_dtensor_rowwise_bias_rounds_on_three_ranks",
                {"row_bias": True, "n": not_power_of_two}, symptom=r"^output: \d+ of \d+ differ, first got "),
        Finding("megatron", "tensor_parallel", "megatron-core", ("0.12", None),
                "megatron-core's vocab_parallel_cross_entropy takes the softmax over the padded vocabulary: the "
                "padding logits enter the denominator, so the loss is not the dense model's (minimal case: tp=2, "
                "vocabulary 3 padded to 4).",
                "suites/tensor_parallel/test_findings.py::test_megatron_loss_includes_padded_vocabulary",
                {"kind": "lm_head", "vocab_remainder": lambda r: r != 0},
                symptom=r"^(loss|input grad|weight grad): \d+ of \d+ differ, first got "),
        Finding("megatron", "tensor_parallel", "megatron-core", ("0.12", None),
                "megatron-core's vocab_parallel_cross_entropy computes in float32 whatever the logits' dtype "
                "(.float()): the loss is held to float32 rounding.",
                "suites/tensor_parallel/test_findings.py::test_megatron_cross_entropy_computes_in_float32",
                {"kind": "lm_head"}, precision="float32"),
        Finding("torch", "tensor_parallel", "torch", ("2.13", None),
                "DTensor on a 1-rank mesh: a sharded dimension of size 1 breaks sharding propagation (ColwiseParallel "
                "of Linear(k, 1) with bias, RowwiseParallel of Linear(1, 1)); torch 2.11 and 2.12 run it (measured).",
                "suites/tensor_parallel/test_findings.py::test_dtensor_size_one_sharded_dimension_on_one_rank",
                handled_by_adapter="the torch adapter declares these cases unsupported"),
        Finding("torch", "tensor_parallel", "torch", ("2.13", None),
                "DTensor RowwiseParallel of an nn.Embedding that leaves a rank an empty vocabulary shard (vocabulary 4 "
                "over 3 ranks) fails on that rank while the others hang; loss_parallel over such logits likewise.",
                "suites/tensor_parallel/test_findings.py::test_dtensor_empty_vocabulary_shard",
                handled_by_adapter="the torch adapter refuses such vocabularies in one sentence"),
        Finding("torch", "tensor_parallel", "torch", ("2.12", None),
                "torch's DistributedDataParallel over a tensor-parallel module by its 2-D path (device_mesh: the dp "
                "dimension of a (dp, tp) mesh) trains as one device but empties the module: DDP swaps each DTensor "
                "parameter for its local shard and a forward pre-hook sets DTensor views of them back as plain "
                "attributes, so after the first forward named_parameters() and state_dict() are empty — a checkpoint "
                "of the model holds no weights, without a word (minimal case: a 2-layer MLP, ColwiseParallel then "
                "RowwiseParallel, dp 2 x tp 2; its source's TODO: 'so that ... the state_dict works out of the box').",
                "suites/tensor_parallel/test_findings.py::test_watch_ddp_over_tensor_parallel_empties_the_module",
                handled_by_adapter="the torch stack runs DDP at tp 1 only (ZeRO 0 / 1 at tp > 1: refused in one "
                                   "sentence)"),
        Finding("torch", "tensor_parallel", "torch", ("2.12", None),
                "torch's GradScaler over DTensor gradients: DTensor reduces found_inf over the mesh dimensions on "
                "which the first gradient of the optimizer's group is sharded, not every gradient's — with a "
                "replicated parameter first (a sequence-parallel norm, a no-decay group listed first) an inf in one "
                "tp rank's shard is that rank's alone: it skips the step and halves its scale while the others step, "
                "and the replicas of the replicated parameters part (minimal case: tp 2, a replicated vector "
                "first, a Shard(0) matrix overflowing on the second rank at the scale 2^16).",
                "suites/tensor_parallel/test_findings.py::"
                "test_watch_grad_scaler_reduces_found_inf_over_the_first_gradients_mesh_dims",
                handled_by_adapter="the torch stack's fp16 hands GradScaler the embedding's gradient first (sharded "
                                   "over dp and tp: the check is reduced over every rank) and runs at pp 1 only"),
    ),
    benches=(
        Bench("tensor_parallel", "forward+backward time and bytes per sharded layer",
              "harness.tensor_parallel.cli:plans", "harness.tensor_parallel.cli:add_arguments"),
    ),
    sections=(Section(30, "harness.tensor_parallel.report:tensor_parallel_section", suite="tensor_parallel"),),
)
