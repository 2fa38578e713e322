"""Gradients with and without activation checkpointing are bitwise identical (float32 and float64):
the recomputation runs the same ops on the same values, and dropout draws the same mask because the
RNG state is restored. A missing RNG restore must fail (planted)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from harness.checkpoint import case as cases
from harness.contracts.checkpoint import POLICIES
from harness.records import findings, registry


def test_checkpointed_gradients_are_bitwise_identical(checkpoint_impl, conformance):
    impl = registry.load(checkpoint_impl, "checkpoint")

    def check(policy, count, hidden, dropout, dtype, input_grad, seed) -> str:
        try:
            problems = cases.compare(impl, policy, count, hidden, dropout, dtype, input_grad, seed)
        except NotImplementedError as exc:
            conformance.record("unsupported", suite="checkpoint", world_size=1, collective=policy,
                               impl=checkpoint_impl, detail=str(exc))
            return f"unsupported: {policy}"
        known = (findings.match(checkpoint_impl, "checkpoint", problems, input_requires_grad=input_grad)
                 if problems else None)
        conformance.record("known-nonconformance" if known else "fail" if problems else "pass", finding=known,
                           suite="checkpoint", world_size=1, dtype=str(dtype).removeprefix("torch."),
                           collective=policy, numel=count * hidden * (hidden + 1), impl=checkpoint_impl,
                           detail=" | ".join(problems[:1]))
        if known:
            return "known non-conformance"
        assert not problems, f"{checkpoint_impl} {policy} L={count} h={hidden} p={dropout} {dtype}: {problems}"
        return ""

    # The corners first, in every profile: L = 1, odd L (sqrt(L) segments do not tile it evenly), dropout on,
    # float32 (the lowest precision drawn) and float64, inputs with and without requires_grad.
    for policy in POLICIES:
        for count, dtype, input_grad in itertools.product((1, 5, 9), (torch.float32, torch.float64), (True, False)):
            check(policy, count, 3, 0.3, dtype, input_grad, count)

    @given(policy=st.sampled_from(POLICIES), count=st.integers(1, 9), hidden=st.integers(1, 8),
           dropout=st.sampled_from([0.0, 0.3]), dtype=st.sampled_from([torch.float32, torch.float64]),
           input_grad=st.booleans(), seed=st.integers(0, 10_000))
    def prop(policy, count, hidden, dropout, dtype, input_grad, seed):
        note = check(policy, count, hidden, dropout, dtype, input_grad, seed)
        if note:
            event(note)

    prop()
    assert conformance.counts.get("pass", 0) > 0
    conformance.settle()


@pytest.mark.parametrize("policy", POLICIES)
def test_missing_rng_restore_is_caught(policy):
    from .planted import NoRngRestore

    problems = cases.compare(NoRngRestore(), policy, 3, 6, 0.5, torch.float64, True, 0)
    assert problems, "recomputed dropout drew new masks, yet every gradient matched"
    assert not cases.compare(NoRngRestore(), policy, 3, 6, 0.0, torch.float64, True, 0)  # no dropout: no RNG


def test_selective_recomputation_of_the_attention_core_is_bitwise_identical():
    from reference.checkpoint import SelectiveAttention, _AttentionCore

    torch.manual_seed(0)
    qkv, proj = torch.nn.Linear(8, 24, dtype=torch.float64), torch.nn.Linear(8, 8, dtype=torch.float64)
    selective = SelectiveAttention(qkv, proj, heads=2, causal=True)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    selective(x).pow(2).sum().backward()
    got = [x.grad.clone(), *[p.grad.clone() for p in selective.parameters()]]
    x.grad = None
    for p in selective.parameters():
        p.grad = None
    b, s, h = x.shape
    q, k, v = qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
    proj(_AttentionCore(True)(q, k, v).transpose(1, 2).reshape(b, s, h)).pow(2).sum().backward()
    want = [x.grad, *[p.grad for p in selective.parameters()]]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_leaked_rng_stream_is_caught_on_the_second_step():
    """Each single step is bitwise right; only the state left for the next step (the caller's RNG) is not."""
    from .planted import LeavesRngAdvanced

    problems = cases.compare(LeavesRngAdvanced(), "layer", 3, 4, 0.5, torch.float64, True, 0)
    assert problems and problems[0] == ("step 1: the caller's RNG state after the step differs (the stream was "
                                        "not left where the plain run leaves it)"), problems
    assert not cases.compare(LeavesRngAdvanced(), "layer", 3, 4, 0.0, torch.float64, True, 0)  # no dropout
