"""Third-party behaviour this suite found, kept under watch (each test fails when torch changes it).

DTensor (torch 2.13, gloo):
1. RowwiseParallel with a bias on a mesh whose size is not a power of two is not exact: the output of
   a row-parallel Linear is Partial, and the replicated bias is added as bias / n on every rank, which
   rounds for n = 3 (minimal case: tp = 3, Linear(3, 4), integer weights and inputs: -1.0000000000000002
   where the dense layer gives -1.0; up to 4.4e-16 off). Without a bias, or with n = 2, it is exact.
2. On a 1-rank mesh, a sharded dimension of size 1 breaks sharding propagation: ColwiseParallel of a
   Linear(k, 1) with bias, RowwiseParallel of a Linear(1, 1), raise "This operation would remove or
   reshape sharded dimension ...".
3. RowwiseParallel with in_features not divisible by the mesh size fails inside the matmul ("a and b
   must have same reduction dim") instead of refusing clearly.
4. RowwiseParallel of an nn.Embedding whose vocabulary leaves a rank an empty shard as torch.chunk
   splits it (minimal case: vocabulary 4 over 3 ranks: 2, 2, 0 rows) fails on that rank ("index_select():
   self indexing axis dim should be positive") while the others hang in the collective; loss_parallel
   over such logits likewise ("index 0 is out of bounds for dimension 1 with size 0").
5. DistributedDataParallel over a tensor-parallel module by its 2-D path (``device_mesh=mesh["dp"]`` of a
   (dp, tp) mesh: DDP then calls ``torch.distributed.tensor.parallel.ddp._pre_dp_module_transform`` itself) trains
   exactly as one device (integer weights and inputs, two SGD steps: bitwise), but the module is emptied: its
   DTensor parameters become local Parameters (held by DDP and the optimizer), a forward pre-hook sets DTensor
   views of them back as plain attributes, and the post-forward hook then finds no parameters to swap back —
   after the first forward ``named_parameters()`` and ``state_dict()`` are empty (minimal case: Linear(4, 8)
   ColwiseParallel, Linear(8, 4) RowwiseParallel, dp 2 x tp 2). A checkpoint of the model holds nothing.
8. torch's GradScaler over DTensor gradients asks DTensor whether any rank found an inf, and DTensor reduces
   ``found_inf`` over the mesh dimensions on which the **first** gradient of the group is not replicated
   (``found_inf_reduce_handler``: the others' placements are not read). With a replicated parameter first —
   a sequence-parallel norm's weight, a no-decay parameter group listed first — an inf in another parameter's
   shard on one tp rank is that rank's alone: it skips the step and halves its scale, the others step and keep
   theirs, and the replicated parameter is no longer the same on every rank (minimal case: tp 2, a replicated
   vector first, a Shard(0) matrix whose second rank's rows overflow at the scale 2^16). Listed the other way
   round every rank skips, as one device does.
The ``torch`` adapter declares 2 unsupported, refuses 3 and 4 with a clear sentence, and reports 1 as
a known non-conformance (outcome ``known-nonconformance`` in conformance.csv, never ``pass``); the torch stack
runs DDP at tp 1 only, so 5 is a watch, and its fp16 hands GradScaler the embedding's gradient first (sharded on
every mesh dimension), so 8 is one too.

megatron-core 0.16.1:
6. vocab_parallel_cross_entropy computes in float32 whatever the logits' dtype (it casts with .float()):
   float64 logits give a float32 loss, ~1e-8 relative off. The contract suite holds it to float32 bounds.
7. Its softmax runs over the padded vocabulary: Megatron pads the output layer to a multiple of the TP
   size and the padding logits enter the denominator, so the loss is not the dense model's (minimal
   case: tp = 2, vocabulary 3 padded to 4, logits 0, 1, 2 and a padding 0: loss 2.4938 where the dense
   loss is 2.4076). Reported as a known non-conformance of the ``lm_head`` kind.
"""

from __future__ import annotations

import pytest

from harness.records import findings
from harness.runtime.world import RankFailure
from suites._support.worlds import gloo_only

from . import findings_ranks


def _cpu(world):
    """``world`` where it runs gloo, else the test skips: these are findings of the CPU path (the ranks' meshes and
    tensors on the CPU; on a GPU node untested)."""
    gloo_only(world, "a finding of the CPU path")
    return world


def test_dtensor_rowwise_bias_rounds_on_three_ranks(world_cache, world_sizes):
    if 3 not in world_sizes:
        pytest.skip("needs a 3-rank world")
    assert max(_cpu(world_cache.get(3)).run(findings_ranks.dtensor_row_bias, 3, True)) > 0.0  # integers, yet not exact
    assert max(_cpu(world_cache.get(3)).run(findings_ranks.dtensor_row_bias, 3, False)) == 0.0


def test_dtensor_rowwise_bias_exact_on_two_ranks(world_cache, world_sizes):
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    assert max(_cpu(world_cache.get(2)).run(findings_ranks.dtensor_row_bias, 4, True)) == 0.0


def test_watch_ddp_over_tensor_parallel_empties_the_module(world_cache, world_sizes):
    """Finding 5: exact training, an empty module after its first forward. Fails when torch keeps the parameters
    (the registry's finding is then fixed) or when the training it does is no longer one device's."""
    if 4 not in world_sizes:
        pytest.skip("needs a 4-rank world (dp 2 x tp 2)")
    for got in _cpu(world_cache.get(4)).run(findings_ranks.ddp_over_tp, timeout=120):
        assert got["off"] == 0.0, got  # integer-valued: DDP's average of the replicas is exact
        assert got["names_before"] == ["0.weight", "2.weight"], got
        assert got["names_after"] == [] and got["state_dict_after"] == [], got


def test_watch_grad_scaler_reduces_found_inf_over_the_first_gradients_mesh_dims(world_cache, world_sizes):
    """Finding 8: which ranks skip an overflowing step depends on the optimizer's parameter order. Fails when
    torch reduces found_inf over every gradient's sharded dimensions (the registry's finding is then fixed), or
    when the order that puts the sharded gradient first stops being one device's (every rank skips, the scale
    halves)."""
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    world = _cpu(world_cache.get(2))
    sharded_first = world.run(findings_ranks.scaler_found_inf, False, timeout=60)
    assert [(r["stepped"], r["scale"]) for r in sharded_first] == [(False, 2.0 ** 15)] * 2, sharded_first
    replicated_first = world.run(findings_ranks.scaler_found_inf, True, timeout=60)
    # the rank whose rows overflowed skips; the other steps, keeps its scale, and its replica of the norm moves
    assert [(r["stepped"], r["scale"]) for r in replicated_first] == [(True, 2.0 ** 16), (False, 2.0 ** 15)], \
        replicated_first
    assert replicated_first[0]["norm"] != replicated_first[1]["norm"], replicated_first


def test_dtensor_size_one_sharded_dimension_on_one_rank(world_cache, world_sizes):
    if 1 not in world_sizes:
        pytest.skip("needs a 1-rank world")
    why = findings.outside_range("suites/tensor_parallel/test_findings.py::test_dtensor_size_one_sharded_dimension_on_"
                                 "one_rank")
    if why:
        pytest.skip(why)
    with pytest.raises(RankFailure, match="would remove or reshape sharded dimension"):
        _cpu(world_cache.get(1)).run(findings_ranks.dtensor_size_one, timeout=60)


def test_dtensor_empty_vocabulary_shard(world_cache, world_sizes):
    if 3 not in world_sizes:
        pytest.skip("needs a 3-rank world")
    with pytest.raises(RankFailure, match="index_select"):
        _cpu(world_cache.get(3)).run(findings_ranks.dtensor_empty_vocab_shard, timeout=60)


def _megatron(world_cache, world_sizes):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (extra paritybench[megatron])")
    if 2 not in world_sizes:
        pytest.skip("needs a 2-rank world")
    return _cpu(world_cache.get(2))


def test_megatron_cross_entropy_computes_in_float32(world_cache, world_sizes):
    r = _megatron(world_cache, world_sizes).run(findings_ranks.megatron_cross_entropy, 4)[0]
    assert r["dtype"] == "torch.float32"
    assert 0 < abs(r["loss"] - r["dense"]) <= 8 * 2.0**-24 * r["dense"]  # float32 rounding, not float64's


def test_megatron_loss_includes_padded_vocabulary(world_cache, world_sizes):
    r = _megatron(world_cache, world_sizes).run(findings_ranks.megatron_cross_entropy, 3)[0]
    assert abs(r["loss"] - r["dense"]) > 0.05, r  # exp(0 - 2) of the padding column in the denominator
