"""Mutation check of our own suites: every planted bug, plugged in through ``--impl`` exactly as a user's
implementation arrives, must be flagged by its paradigm's suite.

    python -m suites.mutation            # every planted bug; exit 1 if any went unnoticed

All planted specs go to one pytest session (each suite takes the specs of its own paradigm), under the
``dev`` hypothesis profile — the thinnest one, so a bug caught here is caught by every profile. A planted
bug is caught when at least one test parametrized with its spec fails. The session runs on
``PARITYBENCH_WORKERS`` pytest-xdist workers (2, as tox; 0: one process) — one process keeps 2 cores
~73 % busy (its ranks wait on each other), two keep them full: 95 bugs in 19.4 min, not ~27 (2026-12; six
tensor-parallel layer bugs since: their selection 12 s in one process, 6 s before).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (planted spec, what it gets wrong, the tests that must flag it)
PLANTED = [
    ("suites.collectives.impls:DropsRemainder", "all-reduce drops the numel % N remainder",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:ForgetsAverage", "AVG returns the sum",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:IgnoresSrc", "broadcast always from rank 0",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:RhdLeavesOutExtraRanks", "recursive doubling leaves out ranks beyond 2^k",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:ReduceScatterNextBlock", "reduce-scatter: rank r gets block r + 1",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:AllToAllBlocksByOffset", "all-to-all: blocks stored by ring offset, not sender",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.collectives.impls:RaisesOnRankOne", "all_gather raises on rank 1",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.pipeline.impls:AveragesMicrobatches", "microbatch losses averaged, not summed",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:DropsAGradient", "a parameter left without a gradient",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:TorchDefaultScaling", "torch's default scale_grads=True for a summed loss",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:ReturnsNoLoss", "step returns no loss",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:UnclampedCooldown1F1B", "a hand-written 1F1B's cool-down unclamped: hangs at m < p - 1",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:WeightBeforeInput", "a W before its I in a split backward",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:DoubleCountsSharedWeight", "a weight used twice in a stage: its gradient counted twice",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:VStageMisplaced", "a V-shaped schedule's stages placed by the loop",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.pipeline.impls:PrematureOverlap", "a DualPipe overlap reading an activation before its forward ends",
     "suites/pipeline/test_equivalence.py::test_pipelined_training_equals_one_device"),
    ("suites.tensor_parallel.planted:ReturnsLocalShardGrads", "full_grads returns the local shard",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:RaisesInFullGrads", "full_grads raises",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:RowBiasOnEveryRank", "TP: a row bias added on every rank, then reduced",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:ColumnInputGradNotReduced", "TP: a column input's gradient never all-reduced",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:EmbeddingNotMasked", "TP: other ranks' tokens embedded as local row 0",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:VocabRemainderDropped", "TP: vocabulary split floor(V / tp), remainder lost",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:CrossEntropyLocalMax", "TP: cross-entropy shifted by each rank's own max",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.tensor_parallel.planted:SequenceParallelBiasPartial", "TP + SP: the row bias's gradient not summed",
     "suites/tensor_parallel/test_conformance.py::test_sharded_layer_equals_dense"),
    ("suites.zero.planted:StepRaises", "the trainer's step raises",
     "suites/zero/test_conformance.py::test_training_equals_one_device"),
    ("suites.zero.planted:MissingAverage", "gradients summed, never averaged",
     "suites/zero/test_conformance.py::test_training_equals_one_device"),
    ("suites.zero.planted:ShiftedShardBoundary", "ZeRO-2 shard boundary one element off",
     "suites/zero/test_conformance.py::test_training_equals_one_device"),
    ("suites.zero.planted:RankOneDrifts", "rank 1's replica drifts (only its own view shows it)",
     "suites/zero/test_conformance.py::test_training_equals_one_device"),
    ("suites.zero.planted:AveragesMicroStepsTwice", "gradient accumulation averages the micro-steps twice",
     "suites/zero/test_seams.py::test_accumulation_and_clipping_equal_one_device"),
    ("suites.zero.planted:MeanPerMicroStep", "a padded batch's per-micro-step means averaged",
     "suites/zero/test_seams.py::test_accumulation_and_clipping_equal_one_device"),
    ("suites.zero.planted:MeanPerRank", "a padded batch's per-rank means averaged",
     "suites/zero/test_seams.py::test_accumulation_and_clipping_equal_one_device"),
    ("suites.zero.planted:NoReplicaReduction", "hybrid sharding: the shards never reduced across the replicas",
     "suites/zero/test_hybrid.py::test_hybrid_sharding_equals_one_device"),
    ("suites.zero.planted:DividesByWorld", "hybrid sharding: the shard group's sum divided by the world size",
     "suites/zero/test_hybrid.py::test_hybrid_sharding_equals_one_device"),
    ("suites.zero.planted:FlatShardDecayedWhole", "ZeRO's AdamW decaying a flat shard whole (its norms and biases too)",
     "suites/zero/test_conformance.py::test_adamw_decays_only_what_its_rule_decays"),
    ("suites.zero.planted:ClipsByShardNorm", "ZeRO 1-3: each shard clipped by its own norm",
     "suites/zero/test_seams.py::test_accumulation_and_clipping_equal_one_device"),
    ("suites.zero.planted:OffloadKeepsFirstMicroStep", "offload: only the first micro-step's gradients kept",
     "suites/zero/test_offload.py::test_offloaded_training_equals_one_device"),
    ("suites.checkpoint.planted:SelectiveIgnored", "selective checkpointing asked, whole layers recomputed",
     "suites/checkpoint/test_equivalence.py::test_the_backward_recomputes_what_the_policy_says"),
    ("suites.checkpoint.planted:SavesEverything", "selective checkpointing asked, the activations saved too",
     "suites/checkpoint/test_equivalence.py::test_the_backward_recomputes_what_the_policy_says"),
    ("suites.checkpoint.planted:NoRngRestore", "recomputed dropout draws new masks",
     "suites/checkpoint/test_equivalence.py::test_checkpointed_gradients_are_bitwise_identical"),
    ("suites.checkpoint.planted:LeavesRngAdvanced", "the caller's RNG stream is left advanced",
     "suites/checkpoint/test_equivalence.py::test_checkpointed_gradients_are_bitwise_identical"),
    ("suites.collectives.impls:LastRankRaisesOnOddLength", "the last rank raises while its peers block",
     "suites/collectives/test_conformance.py::test_collective_matches_exact_oracle"),
    ("suites.stack.planted:KVReplicasNotSummed", "a replicated KV head's gradients never summed",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted:MeanPerMicroBatch", "padded batches: the loss a mean per micro-batch, then averaged",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted:MeanPerRank", "padded batches: the loss a mean per replica, then averaged",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted:ReplicatedCountedTpTimes", "clipping: TP-replicated parameters counted on every TP rank",
     "suites/stack/test_reference_corners.py::test_the_clipping_and_tie_seams_at_their_smallest_layouts"),
    ("suites.stack.planted:PpNotReduced", "clipping: each pipeline stage clips by its own norm",
     "suites/stack/test_reference_corners.py::test_the_clipping_and_tie_seams_at_their_smallest_layouts"),
    ("suites.stack.planted:TiedNotSummed", "the tied embedding's copies never sum their gradients",
     "suites/stack/test_reference_corners.py::test_the_clipping_and_tie_seams_at_their_smallest_layouts"),
    ("suites.stack.planted:LastRankRaises", "the step raises on the last rank while its peers wait",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted:ResumeForgetsMomentum", "resume restores parameters, not the momentum",
     "suites/stack/test_resume.py::test_resume_on_another_layout_equals_one_device"),
    ("suites.stack.planted:MixedMissingAverage", "bf16 with fp32 masters: DP gradients summed, not averaged",
     "suites/stack/test_equivalence.py::test_bf16_with_fp32_masters_equals_one_device"),
    ("suites.stack.planted:Fp16StepsThroughInf", "fp16: the optimizer steps through an overflow the scaler found",
     "suites/stack/test_equivalence.py::test_fp16_with_a_dynamic_loss_scale_equals_one_device"),
    ("suites.stack.planted:Fp16ClipsScaledGradients", "fp16: the gradients clipped while still scaled",
     "suites/stack/test_equivalence.py::test_fp16_with_a_dynamic_loss_scale_equals_one_device"),
    ("suites.stack.planted:AdamUpdateInBf16", "bf16 with fp32 masters: Adam's update rounded to bf16",
     "suites/stack/test_equivalence.py::test_bf16_with_fp32_masters_equals_one_device"),
    ("suites.stack.planted:Float8NotApplied", "asked a float8 recipe, the linear layers computed in float32",
     "suites/stack/test_low_precision.py::test_stack_under_a_float8_recipe_equals_one_device"),
    ("suites.stack.planted:CPAttendsOverItsShardOnly", "context parallelism: attention over the own shard only",
     "suites/stack/test_equivalence.py::test_context_parallel_stack_equals_one_device"),
    ("suites.stack.planted_shapes:CPLocalRotary", "context parallelism: rotary at the shard's local positions",
     "suites/stack/test_equivalence.py::test_context_parallel_stack_equals_one_device"),
    ("suites.stack.planted_shapes:TpGradientsSummed", "TP-replicated parameters' gradients summed over tp",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted_shapes:DroppedRemainderRow", "the vocabulary split floor(V / tp): a row dropped",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted_shapes:Fc1ShardsSwapped", "an MLP layer's TP shards loaded in the wrong rank order",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted_shapes:ReducedOnTheRootOnly", "a row-parallel output reduced onto the TP root only",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted_shapes:UpdateAscends", "every update applied with the wrong sign",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted_shapes:MeanTimesCount", "a micro-batch's mean x its count: 0 / 0 when it counts none",
     "suites/stack/test_equivalence.py::test_stack_equals_one_device"),
    ("suites.stack.planted:CPGradientsNotReduced", "context parallelism: gradients not reduced over cp",
     "suites/stack/test_equivalence.py::test_context_parallel_stack_equals_one_device"),
    ("suites.stack.planted:MoEExpertsDividedByEDP", "MoE stack: expert gradients / the EDP size (the 2x)",
     "suites/stack/test_moe.py::test_moe_stack_equals_one_device"),
    ("suites.stack.planted:MoEExpertsOverWholeGroup", "MoE stack: experts reduced over the whole dp x cp group",
     "suites/stack/test_moe.py::test_moe_stack_equals_one_device"),
    ("suites.stack.planted:MoEAuxPerShard", "MoE stack: the balance loss over a cp shard only",
     "suites/stack/test_moe.py::test_moe_stack_equals_one_device"),
    ("suites.stack.planted:MoEAuxNotInBackward", "MoE stack: the balance loss reported, never back-propagated",
     "suites/stack/test_moe.py::test_moe_stack_equals_one_device"),
    ("suites.stack.planted:TitanExpertsDoubled", "torchtitan's MoE stack: every expert gradient 2x under EP",
     "suites/stack/test_moe.py::test_moe_stack_bf16_over_two_expert_data_parallel_replicas_equals_one_device"),
    ("suites.context_parallel.planted:LocalCausalMask", "ring attention's causal mask by local position",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.context_parallel.planted:LocalRotary", "q and k rotated at local positions",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.context_parallel.planted:MergeWithoutRunningMax", "online softmax merged without the running maximum",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.context_parallel.planted:ZigzagSecondChunkShifted", "zigzag second chunk paired with the wrong block",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.context_parallel.planted:UlyssesHeadsReversed", "Ulysses' head groups re-assembled in the wrong order",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.context_parallel.planted:UlyssesReplicasNotSummed", "replicated KV heads' gradients not summed",
     "suites/context_parallel/test_equivalence.py::test_context_parallel_attention_equals_one_device"),
    ("suites.low_precision.planted:AmaxOverLocalShard", "float8 / MX amaxes over the local shard, never reduced",
     "suites/low_precision/test_equivalence.py::test_low_precision_layer_equals_one_device"),
    ("suites.low_precision.planted:AmaxOverDataParallel", "the amaxes TP must reduce reduced over the DP group",
     "suites/low_precision/test_equivalence.py::test_low_precision_layer_equals_one_device"),
    ("suites.low_precision.planted:GathersInHighPrecision", "the float8 all-gather asked, float32 gathered",
     "suites/low_precision/test_equivalence.py::test_low_precision_layer_equals_one_device"),
    ("suites.low_precision.planted:StaleWeightScale", "the weight's scale kept from the first step",
     "suites/low_precision/test_equivalence.py::test_low_precision_layer_equals_one_device"),
    ("suites.muon.planted:LocalNewtonSchulz", "Muon: Newton-Schulz on a rank's own rows, not the whole matrix",
     "suites/muon/test_equivalence.py::test_muon_equals_one_device"),
    ("suites.muon.planted:FusedAsOne", "Muon: a fused QKV / gate + up orthogonalised as one matrix",
     "suites/muon/test_equivalence.py::test_muon_equals_one_device"),
    ("suites.muon.planted:AdamWForMatrices", "Muon: the hidden matrices silently stepped by AdamW",
     "suites/muon/test_equivalence.py::test_muon_equals_one_device"),
    ("suites.stack.planted:HybridNoReplicaReduction", "a stack's hybrid sharding: shards never reduced across replicas",
     "suites/stack/test_hybrid.py::test_hybrid_sharded_stack_equals_one_device"),
    ("suites.stack.planted:SelectiveIgnored", "a stack's selective checkpointing asked, nothing checkpointed",
     "suites/stack/test_recompute.py::test_checkpointed_or_compiled_stack_equals_one_device"),
    ("suites.stack.planted:SelectiveSavesNoMatmul", "a stack's selective checkpointing run as full recomputation",
     "suites/stack/test_recompute.py::test_checkpointed_or_compiled_stack_equals_one_device"),
    ("suites.stack.planted:MuonOnLocalRows", "a stack's Muon: Newton-Schulz on each TP rank's block of a matrix",
     "suites/stack/test_muon.py::test_stack_trained_with_muon_equals_one_device"),
    ("suites.stack.planted:MuonOnFlatRange", "a stack's Muon at ZeRO 1/2: Newton-Schulz on a rank's flat range",
     "suites/stack/test_muon.py::test_stack_trained_with_muon_equals_one_device"),
    ("suites.stack.planted:DecaysEveryParameter", "AdamW: biases and norms decayed where the rule spares them",
     "suites/stack/test_adamw.py::test_stack_trained_with_adamw_equals_one_device"),
    ("suites.stack.planted:CoupledWeightDecay", "a stack's AdamW: its weight decay coupled into the gradient (L2)",
     "suites/stack/test_adamw.py::test_stack_trained_with_adamw_equals_one_device"),
    ("suites.stack.planted:ScheduleStepsPerMicroBatch", "a stack's lr scheduler stepped per accumulation micro-step",
     "suites/stack/test_lr_schedule.py::test_stack_under_a_schedule_equals_one_device"),
    ("suites.stack.planted:ScheduleOneAhead", "a stack's lr scheduler stepped before the optimizer (one update early)",
     "suites/stack/test_lr_schedule.py::test_stack_under_a_schedule_equals_one_device"),
    ("suites.stack.planted:ScheduleFirstGroupOnly", "a stack's lr schedule set on the first parameter group only",
     "suites/stack/test_lr_schedule.py::test_stack_under_a_schedule_equals_one_device"),
    ("suites.stack.planted:ScheduleSkipsMuon", "a stack's lr schedule skipping Muon's matrices (AdamW's set)",
     "suites/stack/test_lr_schedule.py::test_stack_under_a_schedule_equals_one_device"),
    ("suites.stack.planted:TiedAfterFullyShard", "a stack's tied embedding re-tied after fully_shard (FSDP2: two)",
     "suites/stack/test_tied.py::test_tied_embedding_equals_one_device"),
    ("suites.stack.planted:DDPDividesByDpTwice", "DDP with the loss over the global count: every gradient / dp",
     "suites/stack/test_ddp.py::test_replicated_data_parallelism_equals_one_device"),
    ("suites.stack.planted:SequenceParallelNormsApart", "sequence parallelism: the norms' gradients per share",
     "suites/stack/test_sequence_parallel.py::test_sequence_parallel_equals_one_device"),
    ("suites.stack.planted:ResumeRestartsSchedule", "a stack's resume: the lr scheduler's position not restored",
     "suites/stack/test_resume.py::test_resume_on_another_layout_equals_one_device"),
    ("suites.expert_parallel.planted:RouterNotReduced", "the router's gradient never reduced",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:ExpertsDividedByEDP", "expert gradients over the EDP size (the 2x)",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:ExpertsOverWholeGroup", "local experts reduced over the whole group",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:CombineWithDispatchedIndices", "combine with the dispatched indices",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:AuxOverLocalTokens", "load-balancing loss over the local tokens",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:NotRenormalized", "top-k weights not renormalised",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:SharedOnDispatched", "shared expert on the dispatched tokens",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:BiasIgnored", "sigmoid routing without its selection bias",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
    ("suites.expert_parallel.planted:CapacityIgnored", "a capacity factor never applied",
     "suites/expert_parallel/test_equivalence.py::test_expert_parallel_moe_equals_one_device"),
]


def run(planted=PLANTED, extra_args: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """{planted spec: the failed test ids parametrized with it}; an empty list: the bug went unnoticed."""
    selections = sorted({tests for _, _, tests in planted})
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
               f"--junitxml={report}", *selections, *extra_args]
        for spec, _, _ in planted:
            cmd += ["--impl", spec]
        # a fail is all the table counts: no localisation of it (harness.stack.judge.localising)
        env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "dev", "PARITYBENCH_LOCALISE": "0"}
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        failed = [case.get("name", "") for case in ET.parse(report).iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None]
    # only the tests the table names for it count (a spec may fit another paradigm's contract as well)
    return {spec: [name for name in failed if name.startswith(tests.split("::")[-1] + "[")
                   and (f"[{spec}-" in name or f"[{spec}]" in name)] for spec, _, tests in planted}


def workers() -> tuple[str, ...]:
    """pytest-xdist's arguments for ``PARITYBENCH_WORKERS`` workers, as tox reads it (default 2; 0: one process)."""
    raw = os.environ.get("PARITYBENCH_WORKERS", "2")
    if not raw.isdigit():
        print(f"mutation: PARITYBENCH_WORKERS={raw!r} is not a number of workers (0 for one process, 1, 2, ...).",
              file=sys.stderr)
        raise SystemExit(2)
    return ("-n", raw, "--dist", "loadfile") if int(raw) else ()


def main() -> int:
    caught = run(extra_args=workers())
    width = max(len(spec) for spec, _, _ in PLANTED)
    for spec, what, _ in PLANTED:
        tests = caught[spec]
        verdict = f"caught by {len(tests)} test(s), e.g. {tests[0]}" if tests else "NOT CAUGHT"
        print(f"{spec:{width}s}  {what:52s}  {verdict}")
    missed = [spec for spec, tests in caught.items() if not tests]
    print(f"mutation: {len(PLANTED) - len(missed)} of {len(PLANTED)} planted bugs caught"
          + (f"; missed: {', '.join(missed)}" if missed else "."))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
