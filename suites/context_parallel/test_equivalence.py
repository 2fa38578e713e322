"""Context-parallel attention equals one device: the Llama family's attention (rotary, grouped-query heads)
over cp = 2, 3 and 4 ranks, every rank's output shard, its input gradient and every weight's full gradient
against one device's attention over the whole sequence, float64, within the bound derived in
harness/context_parallel/case.py (``bound``) — for every implementation (ours: ring and Ulysses).

The corners, in every profile: cp = 3; both layouts; causal and not; kv_heads < cp (replicated under
Ulysses) and kv_heads = 1; batch > 1; one token per rank; logits of ~900 (a merge without the running
maximum overflows exp); a sequence the zigzag cannot split (refused in one sentence); heads cp does not
divide (Ulysses refuses; the ring, which splits no heads, runs). Planted bugs, each at its minimal case.
"""

from __future__ import annotations

import pytest

from harness.context_parallel.case import Case, as_dict
from suites._support.layers import judge_context_parallel as judge

CASES = [  # (cp, case)
    (2, Case()),                                                                  # zigzag, causal, GQA 4 / 2
    (2, Case(seq=6, layout="contiguous", causal=False)),                          # contiguous, not causal
    (3, Case(hidden=12, heads=6, kv_heads=3, seq=12)),                            # cp = 3, kv_heads = cp
    (3, Case(hidden=12, heads=6, kv_heads=6, seq=9, batch=3, layout="contiguous")),  # batch 3, full MHA
    (4, Case(heads=4, kv_heads=1, seq=16)),                                       # multi-query: kv < cp
    (4, Case(hidden=16, heads=8, kv_heads=2, seq=4, layout="contiguous")),        # one token per rank, kv < cp
    (2, Case(logit_scale=24.0)),                                                  # scores ~900
]




@pytest.mark.parametrize("cp, case", CASES, ids=[f"cp{cp}-{c.label()}" for cp, c in CASES])
def test_context_parallel_attention_equals_one_device(context_parallel_impl, cp, case, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, context_parallel_impl, cp, case)
    if outcome == "unsupported":
        pytest.skip(f"{context_parallel_impl} does not provide this case: {refused}")
    assert outcome != "refused", f"{context_parallel_impl} refused a case that fits: {refused}"
    assert not problems, problems[:4]


def test_large_logits_really_overflow_a_merge_without_the_maximum(world_cache, conformance):
    """The large-logit case's scores pass exp's float64 range (709.8): the corner is real."""
    *_, per_rank = judge(world_cache, conformance, "reference-ring", 2, CASES[-1][1])
    assert per_rank[0]["s_max"] > 710, per_rank[0]["s_max"]


def test_a_sequence_the_zigzag_cannot_split_is_refused(context_parallel_impl, world_cache, conformance):
    """6 tokens over cp 2: the zigzag needs 4 equal chunks — refused in one sentence, never a short rank."""
    outcome, refused, problems, _ = judge(world_cache, conformance, context_parallel_impl, 2, Case(seq=6))
    assert outcome in ("refused", "unsupported"), problems[:3]
    assert "\n" not in refused and "6" in refused, refused


@pytest.mark.parametrize("cp, heads, kv", [(4, 6, 6), (3, 6, 2)], ids=["heads6-over-cp4", "kv2-over-cp3"])
def test_heads_ulysses_cannot_split_are_refused_the_ring_runs(cp, heads, kv, world_cache, conformance):
    """Never [2, 2, 2, 0] (DeepSpeed #8291): 6 heads over cp 4 are refused by Ulysses in one sentence; so are
    2 KV heads over cp 3 (neither split nor replicated evenly). The ring splits no heads: it runs."""
    case = Case(hidden=12, heads=heads, kv_heads=kv, seq=4 * cp)
    outcome, refused, problems, _ = judge(world_cache, conformance, "reference-ulysses", cp, case)
    assert outcome == "refused" and "\n" not in refused and f"cp = {cp}" in refused, (outcome, refused, problems)
    outcome, _, problems, _ = judge(world_cache, conformance, "reference-ring", cp, case)
    assert outcome == "pass", problems[:3]


PLANTED = [
    ("LocalCausalMask", 2, Case(), "output"),
    ("LocalRotary", 2, Case(), "output"),
    ("MergeWithoutRunningMax", 2, Case(logit_scale=24.0), "NaN or inf"),
    ("ZigzagSecondChunkShifted", 2, Case(), "output"),
    ("UlyssesHeadsReversed", 2, Case(), "output"),
    ("UlyssesReplicasNotSummed", 4, Case(heads=4, kv_heads=2, seq=16), "gradient k.weight"),
]


@pytest.mark.parametrize("name, cp, case, needle", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bugs_fail_at_their_minimal_case(name, cp, case, needle, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, f"suites.context_parallel.planted:{name}", cp, case)
    assert outcome == "fail", (outcome, refused)
    assert any(needle in p for p in problems), problems[:4]


@pytest.mark.parametrize("impl", ["reference-ring", "reference-ulysses"])
@pytest.mark.parametrize("cp, case", [(2, Case()), (4, Case(heads=4, kv_heads=1, seq=16))], ids=["cp2-gqa", "cp4-mqa"])
def test_bytes_sent_are_the_cost_model_exactly(impl, cp, case, world_cache):
    """Forward and backward bytes each rank sends, counted, equal ``cost_model.cp_layer_comm_bytes``: the
    ring's K/V blocks (cp - 1 hops forward; backward cp - 1 of K/V and cp of dK/dV), Ulysses' four
    all-to-alls each way (q, k, v and the output; KV heads replicated to cp where fewer)."""
    from harness.context_parallel.case import count_bytes
    from reference.cost_model import cp_layer_comm_bytes

    want = cp_layer_comm_bytes(impl.removeprefix("reference-"), case.batch, case.seq, case.heads, case.kv_heads,
                               case.hidden // case.heads, cp, element_size=8)
    for got in world_cache.get(cp).run(count_bytes, impl, as_dict(case), timeout=120):
        assert got == {"forward": want["forward"], "backward": want["backward"]}, (got, want)
