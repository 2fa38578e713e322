"""DeepSpeed's MoE layer (``deepspeed.moe.layer.MoE``) against one device, part by part.

DeepSpeed computes its gate in float32 whatever the model's dtype, and its auxiliary loss is its own: over
each rank's tokens, and for top-2 over first choices only (harness/adapters/deepspeed/moe.py). So it is not
run under the contract's float64 property (it could not pass, and no bug would be the reason); here, in
float32, dropless, without the Gumbel-sampled second expert, every part is held to one device computing the
aux as DeepSpeed defines it — the output, the aux, the input gradient, the router's and every expert's
gradient — within harness/expert_parallel/case.py's bound in float32 units; and a watch holds that its aux
is not the contract's (it fails when DeepSpeed's definition changes). What it does not compute is
unsupported in one sentence: a shared expert, sigmoid scores, a renormalised top-1.
"""

from __future__ import annotations

import pytest

from harness.expert_parallel.case import Case, as_dict
from harness.expert_parallel.third_party import deepspeed_moe_report
from harness.records import registry
from harness.records.registry import ImplSpec
from harness.records.releases import TORCHTITAN_03

DEEPSPEED = registry.skip_reason(ImplSpec("deepspeed-moe", "expert_parallel", "x:y", requires=("deepspeed",)))
needs_deepspeed = pytest.mark.skipif(bool(DEEPSPEED), reason=f"DeepSpeed MoE: {DEEPSPEED}")

CASES = [(2, Case(top_k=2)),                                # top-2 over ep 2
         (2, Case(top_k=1, renormalize=False, skew=True)),  # top-1, every token to EP rank 0: rank 1 gets none
         (4, Case(top_k=2, ep=2))]                          # two expert-data-parallel replicas


@needs_deepspeed
@pytest.mark.parametrize("n, case", CASES, ids=[c.label() for _, c in CASES])
def test_deepspeed_moe_equals_one_device_under_its_own_aux(n, case, world_cache, conformance):
    per_rank = world_cache.get(n).run(deepspeed_moe_report, as_dict(case), timeout=180)
    problems = [p for r in per_rank for p in r["problems"]]
    worst = max(v for r in per_rank for k, v in r["parts"].items() if k != "aux vs the contract's")
    conformance.record("fail" if problems else "pass", suite="expert_parallel", world_size=n, dtype="float32",
                       impl="deepspeed-moe", collective=f"deepspeed-aux/{case.label()}", max_rel_err=worst,
                       detail=" | ".join(problems[:1]))
    assert not problems, problems[:4]
    # watch: DeepSpeed's aux is over the rank's own tokens (and top-2's first choices), not the contract's
    away = max(r["parts"]["aux vs the contract's"] for r in per_rank)
    conformance.record("known-nonconformance", suite="expert_parallel", world_size=n, dtype="float32",
                       impl="deepspeed-moe", collective=f"contract-aux/{case.label()}", max_rel_err=away,
                       detail="l_aux over each rank's tokens (top-2: first choices only), not the group's")
    assert away > 100 * per_rank[0]["bound"], away


@needs_deepspeed
@pytest.mark.parametrize("case, needle", [
    (Case(shared=1, top_k=2), "no shared expert"),
    (Case(scoring="sigmoid", top_k=2), "softmax only"),
    (Case(top_k=1), "weights a top-1 expert by its probability")], ids=["shared", "sigmoid", "top1-renormalised"])
def test_what_deepspeed_moe_does_not_compute_is_unsupported(case, needle):
    from harness.adapters.deepspeed.moe import DeepSpeedMoE
    from harness.contracts import Unsupported
    from reference.models.moe import MoE

    dense = MoE(case.hidden, case.ffn, case.experts, case.top_k, case.shared, case.scoring, case.renormalize)
    with pytest.raises(Unsupported, match=needle) as err:
        DeepSpeedMoE().shard(dense, None, 2)
    assert "\n" not in str(err.value)


@needs_deepspeed
@pytest.mark.parametrize("gone", ["_get_expert_data_parallel_group", "_get_expert_parallel_group"])
def test_a_deepspeed_without_its_private_expert_group_readers_is_unsupported(gone):
    """The guard of the adapter's private reads (``deepspeed.utils.groups``' expert-group readers: DeepSpeed has no
    public one): where one is missing, the layer is unsupported in one sentence, before any group is built; with
    both it is built as before (the equivalence test above)."""
    from unittest import mock

    from deepspeed.utils import groups

    from harness.adapters.deepspeed.moe import DeepSpeedMoE
    from harness.contracts import Unsupported
    from reference.models.moe import MoE

    case = CASES[0][1]
    dense = MoE(case.hidden, case.ffn, case.experts, case.top_k, case.shared, case.scoring, case.renormalize)
    with mock.patch.object(groups, gone, None), pytest.raises(Unsupported, match="expert groups its engine reduces "
                                                                                 "over cannot be read") as err:
        DeepSpeedMoE().shard(dense, None, 2)
    assert gone in str(err.value) and "\n" not in str(err.value)


TORCHTITAN = registry.skip_reason(ImplSpec("torchtitan", "stack", "x:y", requires=("torchtitan", "spmd_types"),
                                           drives=TORCHTITAN_03))


@pytest.mark.skipif(bool(TORCHTITAN), reason=f"torchtitan: {TORCHTITAN}")
def test_torchtitans_experts_compute_in_bfloat16(world_cache):
    """Watch: torchtitan's ``GroupedExperts`` casts tokens and weights to bfloat16 for its grouped GEMM whatever
    their dtype (the output is cast back): float64 experts come out 5e-3 of their magnitude from float64 — bf16
    rounding, so its MoE cannot be held to this contract's float64 (or float32) property: the precision-matched
    property of test_torchtitan_moe.py holds it. Fails once it computes in the tokens' dtype."""
    from suites.stack.torchtitan_ranks import torchtitan_experts_error

    got = world_cache.get(1).run(torchtitan_experts_error, timeout=120)[0]
    assert "raised" not in got, got
    assert got["dtype"] == "torch.float64" and 1e-4 < got["rel"] < 5e-2, got
