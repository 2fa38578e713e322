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


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "selective"])  # the reference's (the planted's base)
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


RECOMPUTES = {"layer": {"aten.addmm": 1, "aten.gelu": 1}, "selective": {"aten.addmm": 0, "aten.gelu": 1}}
"""Per layer, the forward ops each policy's backward reruns: "layer" the whole layer (its Linear's addmm, its GELU),
"selective" everything but the saved matmuls. The backward's own GEMMs are aten.mm (never addmm) and its GELU
gelu_backward: the counts are the recompute's alone."""


@pytest.mark.parametrize("policy", list(RECOMPUTES))
def test_the_backward_recomputes_what_the_policy_says(checkpoint_impl, policy, conformance):
    from harness.checkpoint.recompute import recomputed

    impl, layers = registry.load(checkpoint_impl, "checkpoint"), 4
    try:
        ops = recomputed(impl, policy, layers, 8, 0.3, torch.float32)
    except NotImplementedError as exc:
        pytest.skip(f"{checkpoint_impl} does not provide {policy}: {exc}")
    if ops is None:
        pytest.skip("this torch's dispatch mode does not see a backward's ops: the recompute is not counted "
                    "(the gradients are still held bit for bit)")
    got = {op: ops.get(op, 0) for op in RECOMPUTES[policy]}
    want = {op: per_layer * layers for op, per_layer in RECOMPUTES[policy].items()}
    conformance.record("pass" if got == want else "fail", suite="checkpoint", world_size=1, dtype="float32",
                       collective=f"{policy}/recomputed", impl=checkpoint_impl, detail=f"{got} vs {want}")
    assert got == want, f"{policy}: the backward recomputed {got}, the policy says {want}"


def test_the_recompute_counter_falls_back_to_none_when_the_mode_is_missing(monkeypatch):
    """The guard: where torch's private dispatch mode cannot be imported, no count (None), never a crash."""
    from harness.checkpoint import recompute

    def missing():
        raise ImportError("torch.utils._python_dispatch moved")

    monkeypatch.setattr(recompute, "_CLASS", [])
    monkeypatch.setattr(recompute, "_counter_class", missing)
    assert recompute.counter() is None
    impl = registry.load("torch", "checkpoint")
    assert recompute.recomputed(impl, "layer", 2, 4, 0.0, torch.float32) is None


@pytest.mark.parametrize("planted", ["SelectiveIgnored", "SavesEverything"])
def test_a_selective_policy_not_applied_is_caught_by_its_recompute(planted):
    """Both compute the same gradients bit for bit (the gradient check passes them); the recompute count fails them."""
    from harness.checkpoint.recompute import recomputed

    from . import planted as plants

    impl = getattr(plants, planted)()
    assert not cases.compare(impl, "selective", 3, 6, 0.3, torch.float64, True, 0)
    ops = recomputed(impl, "selective", 4, 8, 0.3, torch.float32)
    if ops is None:
        pytest.skip("this torch's dispatch mode does not see a backward's ops")
    got = {op: ops.get(op, 0) for op in RECOMPUTES["selective"]}
    assert got != {op: n * 4 for op, n in RECOMPUTES["selective"].items()}, got
