"""torchtitan's MoE layer (its router, its all-to-all token dispatcher and grouped experts, parallelized by its
own sharding code over an EP mesh) against one device, part by part — on a CPU with gloo.

Its grouped experts compute in bfloat16 whatever the weights' dtype, and it has no load-balancing loss
(harness/adapters/torchtitan/moe.py). So every part is held precision-matched
(harness/expert_parallel/torchtitan_report.py): within allowed_ratio x E_T of torchtitan's own layer on one
device, E_T being that layer's distance from our float64 layer — which is itself held within its bf16 recipe's
bound, so a wrong one-device run cannot widen the bound. Cases: top-2 over ep 2; top-1 with every token routed to
EP rank 0 (rank 1 receives none); a shared expert; ep 2 over 4 ranks (two expert-data-parallel replicas); its
sigmoid router with the selection bias; ep 3 with E = 6; E = ep with one token per rank.
"""

from __future__ import annotations

import pytest

from harness.expert_parallel.case import Case, as_dict
from harness.records import registry
from harness.records.registry import ImplSpec
from harness.records.releases import TORCHTITAN_03

TORCHTITAN = registry.skip_reason(ImplSpec("torchtitan", "stack", "x:y", requires=("torchtitan", "spmd_types"),
                                           drives=TORCHTITAN_03))
pytestmark = pytest.mark.skipif(bool(TORCHTITAN), reason=f"torchtitan: {TORCHTITAN}")

CASES = [  # (ranks, case, in every profile)
    (2, Case(top_k=2), False),                               # top-2 over ep 2
    (2, Case(top_k=1, renormalize=False, skew=True), True),  # every token to EP rank 0: rank 1 gets none
    (2, Case(top_k=2, shared=1), False),                     # a shared expert
    (4, Case(top_k=2, ep=2), True),                          # two expert-data-parallel replicas
    (2, Case(experts=8, scoring="sigmoid"), True),           # its sigmoid router with the selection bias
    (3, Case(experts=6), False),                             # ep 3
    (2, Case(experts=2, tokens=1), False),                   # E = ep, one token per rank
]


@pytest.mark.parametrize("n, case", [pytest.param(n, c, id=f"n{n}-{c.label()}", marks=[] if every else
                                                  [pytest.mark.thorough]) for n, c, every in CASES])
def test_torchtitan_moe_equals_one_device_precision_matched(n, case, world_cache, conformance):
    from harness.expert_parallel.torchtitan_report import torchtitan_moe_report

    per_rank = world_cache.get(n).run(torchtitan_moe_report, as_dict(case), timeout=180)
    problems = [p for r in per_rank for p in r["problems"]]
    worst = max(v[0] for r in per_rank for v in r["parts"].values())
    conformance.record("fail" if problems else "pass", suite="expert_parallel", world_size=n, dtype="bfloat16",
                       impl="torchtitan-moe", collective=f"precision-matched/{case.label()}", max_rel_err=worst,
                       detail=" | ".join(problems[:1]))
    assert not problems, problems[:4]
    assert all(r["aux"] == 0.0 for r in per_rank)  # no load-balancing loss: none is added on either side
    if case.skew:
        assert per_rank[1]["received"] == 0 < per_rank[0]["received"], [r["received"] for r in per_rank]


def test_experts_that_do_not_split_over_ep_are_refused_in_one_sentence():
    from harness.adapters.torchtitan.moe import TorchtitanMoE
    from reference.models.moe import MoE

    with pytest.raises(ValueError, match="4 experts do not split evenly over ep = 3") as err:
        TorchtitanMoE().shard(MoE(8, 8, 4, 2), None, 3)
    assert "\n" not in str(err.value)
