"""Expert parallelism equals one device: the MoE feed-forward (reference.models.moe) over 2, 3 and 4 ranks,
every rank's output rows, input gradient, the load-balancing loss over the group's tokens, and every
parameter's full gradient (router, each expert, shared experts) against one device's layer on every token,
float64, within the bound derived in harness/expert_parallel/case.py — for every implementation (ours).

Corners in every profile: ep = 3 with E = 6 (and E % ep != 0 refused); a rank receiving zero tokens (a
skewed router); top-k 1 and 2; E = ep; one token per rank; a shared expert; sigmoid scoring with a selection
bias; ep < n (the expert-data-parallel group of 2 replicas); a capacity factor of 1 (each rank's rule: under the
skewed router half the assignments are dropped — asserted), also over two replicas. No top-k choice is tied
(how: the case's docstring). Planted bugs, each at its minimal case."""

from __future__ import annotations

import pytest

from harness.expert_parallel.case import Case, as_dict
from suites._support.layers import judge_expert_parallel as judge

CASES = [  # (n, case)
    (2, Case()),                                                       # E 4 over ep 2, top-2, softmax
    (2, Case(top_k=1, shared=1)),                                      # top-1, a shared expert
    (3, Case(experts=6)),                                              # ep = 3, E = 6
    (2, Case(experts=2, top_k=1, tokens=1)),                           # E = ep, one token per rank
    (2, Case(skew=True)),                                              # rank 1 receives zero tokens
    (4, Case(ep=2, shared=1)),                                         # ep 2 < n 4: replicas over 2 EP groups
    (4, Case(scoring="sigmoid", renormalize=True, experts=8)),         # DeepSeek-V3's sigmoid scores
    (2, Case(renormalize=False)),                                      # top-2 weighted by the softmax itself
    (2, Case(skew=True, capacity_factor=1.0)),                         # capacity: half the skewed tokens dropped
    (4, Case(ep=2, shared=1, capacity_factor=1.0)),                    # capacity over EDP replicas
]




@pytest.mark.parametrize("n, case", CASES, ids=[f"n{n}-{c.label()}" for n, c in CASES])
def test_expert_parallel_moe_equals_one_device(expert_parallel_impl, n, case, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, expert_parallel_impl, n, case)
    if outcome == "unsupported":
        pytest.skip(f"{expert_parallel_impl} does not provide this case: {refused}")
    assert outcome != "refused", f"{expert_parallel_impl} refused a case that fits: {refused}"
    assert not problems, problems[:4]


def test_the_selection_bias_really_moves_choices(world_cache, conformance):
    """The sigmoid corners' bias changes some token's experts — else a dropped bias would pass them."""
    for n, case in [(c[0], c[1]) for c in CASES if c[1].scoring == "sigmoid"] + [(2, Case(scoring="sigmoid"))]:
        *_, per_rank = judge(world_cache, conformance, "reference", n, case)
        assert per_rank[0]["bias_moves"] > 0, (n, case)


def test_the_capacity_corners_really_drop(world_cache, conformance):
    """The capacity corners drop assignments — else a capacity never applied would pass them."""
    for n, case in [(n, c) for n, c in CASES if c.capacity_factor is not None]:
        *_, per_rank = judge(world_cache, conformance, "reference", n, case)
        assert per_rank[0]["dropped"] > 0, (n, case)


def test_the_skewed_router_really_starves_a_rank(world_cache, conformance):
    *_, per_rank = judge(world_cache, conformance, "reference", 2, Case(skew=True))
    assert [r["received"] for r in per_rank][1] == 0 and per_rank[0]["received"] > 0, per_rank


def test_experts_that_do_not_split_over_ep_are_refused(expert_parallel_impl, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, expert_parallel_impl, 3, Case(experts=4))
    assert outcome in ("refused", "unsupported"), problems[:3]
    assert "\n" not in refused and "4" in refused, refused


PLANTED = [
    ("RouterNotReduced", 2, Case(), "gradient router.weight"),
    ("ExpertsDividedByEDP", 2, Case(), "gradient experts."),
    ("ExpertsOverWholeGroup", 4, Case(ep=2), "gradient experts."),
    ("CombineWithDispatchedIndices", 2, Case(), "output"),
    ("AuxOverLocalTokens", 2, Case(), "load-balancing loss"),
    ("NotRenormalized", 2, Case(), "output"),
    ("SharedOnDispatched", 2, Case(shared=1), "output"),
    ("BiasIgnored", 2, Case(scoring="sigmoid", experts=4), "output"),
    ("CapacityIgnored", 2, Case(skew=True, capacity_factor=1.0), "output"),
]


@pytest.mark.parametrize("name, n, case, needle", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bugs_fail_at_their_minimal_case(name, n, case, needle, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, f"suites.expert_parallel.planted:{name}", n, case)
    assert outcome == "fail", (outcome, refused)
    assert any(needle in p for p in problems), problems[:4]


@pytest.mark.parametrize("n, case", [(2, Case()), (2, Case(skew=True)), (4, Case(ep=2, shared=1)),
                                     (2, Case(skew=True, capacity_factor=1.0))],
                         ids=["n2", "n2-skew", "n4-ep2", "n2-skew-capacity"])
def test_bytes_sent_are_the_cost_model_exactly(n, case, world_cache):
    """Each rank's forward and backward bytes, counted, equal ``cost_model.ep_layer_comm_bytes`` of the
    routing it saw (the counts exchanged, the expert ids, dispatch and combine each way; a capacity's dropped
    assignments never sent) — under a skewed router too
    (rank 1 sends everything, receives nothing) — plus, forward, the load-balancing loss's three
    all-reduces over the group (E counts, the token total, the loss itself: float64), which are not EP's."""
    from harness.expert_parallel.case import count_bytes
    from reference.cost_model import collective_bytes, ep_layer_comm_bytes

    aux = collective_bytes("all_reduce", n, 8 * case.experts) + 2 * collective_bytes("all_reduce", n, 8)
    for got in world_cache.get(n).run(count_bytes, "reference", as_dict(case), timeout=120):
        send, recv = got["counts"]
        want = ep_layer_comm_bytes(send, recv, got["ep_rank"], case.hidden, element_size=8)
        assert (got["forward"], got["backward"]) == (want["forward"] + aux, want["backward"]), (got, want)
