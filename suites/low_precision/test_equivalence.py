"""Low-precision training equals one device running the same recipe: a linear layer under float8 tensorwise,
float8 rowwise and MXFP8 (emulated), two SGD steps, every call's output and input gradient and every step's weight
gradient and weight, within the fp32 accumulation bound derived in harness/low_precision/case.py — over data
parallelism with accumulation, TP column and row (with and without sequence parallelism), FSDP (with and without
the float8 all-gather, shards padded where the weight does not divide) and DP x TP.

The inputs ramp by 64x along every dimension, so any shard's amax is far from the whole tensor's: a scale from a
local amax, from the wrong group or from the last step fails here (the planted bugs, each at its minimal case).
Corners in every profile: tp 3; tp 4 with MXFP8 blocks exactly one shard wide; a weight whose N K is odd over
dp 2 (FSDP's padding, torchao #3982's case); m 2 x dp 2 (activation scales per call); MXFP8 blocks a TP shard
would split (refused in one sentence); the float8 all-gather with rowwise scales (unsupported: a row's amax spans
shards)."""

from __future__ import annotations

import pytest

from harness.low_precision.case import Case
from harness.records import findings
from suites._support.layers import judge_low_precision as judge

RECIPES = ("float8-tensorwise", "float8-rowwise", "mxfp8")
LAYOUTS = [  # (case fields): per recipe
    dict(kind="replicated", dp=2, tp=1, microbatches=2),
    dict(kind="column", tp=2),
    dict(kind="column", tp=2, sp=True),
    dict(kind="row", tp=2),
    dict(kind="row", tp=2, sp=True),
    dict(kind="row", dp=2, tp=2),
    dict(kind="fsdp", dp=2, tp=1, microbatches=2),
]
CASES = [Case(recipe=r, **f) for r in RECIPES for f in LAYOUTS] + [
    Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True),                              # the float8 all-gather
    Case(recipe="mxfp8", kind="fsdp", dp=2, tp=1, fp8_all_gather=True),              # asked where none is: refused
    Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True, n=33, k=21, microbatches=2),  # padded shards: N K odd
    Case(kind="fsdp", dp=4, tp=1, fp8_all_gather=True, n=30, k=10),                  # 300 over 4: padded
    Case(recipe="float8-rowwise", kind="column", tp=3, n=48),                        # tp 3
    Case(recipe="float8-tensorwise", kind="row", tp=3, k=48, sp=True, tokens=33),    # tp 3, SP over 11 tokens
    Case(recipe="mxfp8", kind="column", tp=4, n=128, sp=True),                       # blocks one shard wide
    Case(recipe="mxfp8", kind="row", tp=4, k=128),
]


TORCHTITAN_TOX = {"replicated", "column"}
"""torchtitan's layouts in tox: every one of its rowwise cases hits the one finding (emulated, it trains tensorwise);
the other layouts run in the thorough env (tox's budget)."""


@pytest.mark.parametrize("case", CASES, ids=[c.label() for c in CASES])
def test_low_precision_layer_equals_one_device(low_precision_impl, case, world_cache, conformance, sweep):
    sweep.require(low_precision_impl != "torchtitan" or case.kind in TORCHTITAN_TOX,
                  "thorough: torchtitan's rowwise layouts all hit its one finding; tox runs replicated and column")
    hang = findings.known_hang(low_precision_impl, "low_precision", **case.finding_keys())
    if hang:  # not run: a deadlock costs the hang window and a respawn; its watch runs the minimal case
        conformance.record("fail", hang, suite="low_precision", world_size=case.world, dtype="float64",
                           impl=low_precision_impl, collective=case.label(), detail="not run: a known deadlock")
        conformance.settle()
    outcome, refused, problems, _ = judge(world_cache, conformance, low_precision_impl, case)
    known = findings.match(low_precision_impl, "low_precision", problems, **case.finding_keys()) \
        if outcome == "fail" else None
    if known:
        conformance.known.append(known)
        conformance.settle()
    if outcome == "unsupported":
        pytest.skip(f"{low_precision_impl} does not provide this case: {refused}")
    assert outcome != "refused", f"{low_precision_impl} refused a case that fits: {refused}"
    assert not problems, problems[:4]


def test_the_weight_amax_really_moves_between_steps(world_cache, conformance):
    """Step 2's weight has another amax than step 1's — else a scale kept from step 1 would pass."""
    *_, per_rank = judge(world_cache, conformance, "reference", Case())
    assert per_rank[0]["amax_moved"], per_rank[0]


def test_mx_blocks_a_tp_shard_would_split_are_refused(low_precision_impl, world_cache, conformance):
    """K 96 over tp 2: shards of 48 split MXFP8's blocks of 32 — refused in one sentence."""
    outcome, refused, problems, _ = judge(world_cache, conformance, low_precision_impl,
                                          Case(recipe="mxfp8", kind="row", k=96))
    if outcome == "unsupported" and "mxfp8" in refused.lower():
        pytest.skip(f"{low_precision_impl} does not provide MXFP8: {refused}")
    assert outcome in ("refused", "unsupported"), problems[:3]
    assert "\n" not in refused and "32" in refused, refused


def test_the_float8_all_gather_with_rowwise_scales_is_unsupported(world_cache, conformance):
    outcome, refused, _, _ = judge(world_cache, conformance, "reference",
                                   Case(recipe="float8-rowwise", kind="fsdp", dp=2, tp=1, fp8_all_gather=True))
    assert outcome == "unsupported" and "tensorwise" in refused, (outcome, refused)


def test_the_float8_all_gather_moves_one_byte_per_element(world_cache, conformance):
    *_, per_rank = judge(world_cache, conformance, "reference", Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True))
    assert all(r["gather_bytes_per_element"] < 1.01 for r in per_rank), per_rank


PLANTED = [
    ("AmaxOverLocalShard", Case(kind="row"), "output"),
    ("AmaxOverLocalShard", Case(recipe="float8-rowwise", kind="row"), "output"),
    ("AmaxOverLocalShard", Case(recipe="float8-rowwise", kind="column"), "input gradient"),
    ("AmaxOverDataParallel", Case(kind="row", dp=2, tp=2), "output"),
    ("GathersInHighPrecision", Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True), "bytes per weight element"),
    ("StaleWeightScale", Case(kind="column"), "step 1"),
    ("StaleWeightScale", Case(kind="fsdp", dp=2, tp=1, fp8_all_gather=True), "step 1"),
]


@pytest.mark.parametrize("name, case, needle", PLANTED, ids=[f"{p[0]}-{p[1].label()}" for p in PLANTED])
def test_planted_bugs_fail_at_their_minimal_case(name, case, needle, world_cache, conformance):
    outcome, refused, problems, _ = judge(world_cache, conformance, f"suites.low_precision.planted:{name}", case)
    assert outcome == "fail", (outcome, refused)
    assert any(needle in p for p in problems), problems[:4]
