"""Every tensor-parallel implementation, through the contract, equals the dense layer for every kind:
column, row and embedding bit for bit (integer weights and inputs), the GELU MLP, the LM head's
vocabulary-parallel cross-entropy and attention within the bounds derived in contract_ranks. Sizes that
do not divide by the TP size must be refused in one sentence, split as torch.chunk does, or padded."""

from __future__ import annotations

import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from harness.contracts.tensor_parallel import KINDS
from harness.records import findings
from harness.runtime.world import run_or_fail
from harness.tensor_parallel import case as contract_ranks
from harness.tensor_parallel import layer_case as ranks
from harness.verdict import failed, reduce


def _dims(data, kind: str, n: int, sp: bool) -> tuple[tuple, bool]:
    """(dims for contract_ranks.contract_case, whether every split size divides by n)."""
    seq = data.draw(st.integers(1, 3), label="seq per rank") * (n if sp else 1)
    batch = data.draw(st.integers(1, 2), label="batch")
    divisible = data.draw(st.booleans(), label="split size divides by tp")

    def split_size(label: str) -> int:
        return data.draw(st.integers(1, 4), label=label) * n + (0 if divisible else 1)

    if kind == "embedding":
        dims = (seq, batch, split_size("vocab"), data.draw(st.integers(1, 4), label="dim"))
    elif kind == "lm_head":
        dims = (seq, batch, data.draw(st.integers(1, 4), label="hidden"), split_size("vocab"))
    elif kind == "attention":
        dims = (seq, batch, split_size("heads"), data.draw(st.integers(1, 3), label="head_dim"))
    else:
        in_f = data.draw(st.integers(1, 5)) * (n if divisible or kind != "row" else 1) + (0 if divisible else 1)
        out_f = data.draw(st.integers(1, 5)) * (n if divisible or kind == "row" else 1) + (0 if divisible else 1)
        dims = (seq, batch, in_f, out_f)
    split = dims[2] if kind in ("row", "embedding", "attention") else dims[3]  # mlp: its ffn
    return dims, split % n == 0


def _corner_dims(kind: str, n: int, sp: bool, divisible: bool) -> tuple:
    """dims for a corner: the split size (features, heads, vocabulary, ffn) is 2n, or 2n + 1 (V % tp != 0)."""
    seq, batch, split = 2 * (n if sp else 1), 2, 2 * n + (0 if divisible else 1)
    if kind in ("row", "embedding", "attention"):
        return (seq, batch, split, 3 if kind != "attention" else 2)
    return (seq, batch, 3, split)  # column, mlp (its ffn), lm_head (its vocabulary)


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_layer_equals_dense(tensor_parallel_impl, kind, world_cache, world_sizes, conformance):
    def check(n: int, sp: bool, dims: tuple, divisible: bool, seed: int) -> str:
        case = (tensor_parallel_impl, kind, dims, seed, sp)
        per_rank = run_or_fail(world_cache.get(n), contract_ranks.contract_case, *case,
                               failed=lambda detail: failed(detail, case={}))
        v = reduce(per_rank)
        problems = v.problems
        known = (findings.match(tensor_parallel_impl, "tensor_parallel", problems, **per_rank[0]["case"])
                 if v.outcome == "fail" else None)
        declared = v.outcome == "unsupported"
        outcome = "known-nonconformance" if known else v.outcome
        conformance.record(outcome, finding=known, suite="tensor_parallel", world_size=n, dtype="float64",
                           collective=kind, numel=math.prod(dims), impl=tensor_parallel_impl,
                           detail=" | ".join(problems[:1]))
        if v.refused:
            refused = [r["refused"] for r in per_rank]
            assert None not in refused, f"{case}: refused on some ranks only: {refused}"
            assert declared or not divisible, f"{case} refused although every size divides by {n}: {refused}"
            assert all("\n" not in msg for msg in refused), refused
            return "declared unsupported" if declared else "refused a size that does not divide"
        if known:  # reported as what it is (a row in conformance.csv, xfail at the end), never as a pass
            return "known non-conformance"
        assert not problems, f"tp={n} {case}: {problems[:3]}"
        return ""

    # The corners first, in every profile: tp = 3 and the largest, with and without sequence parallelism,
    # split sizes that divide and that do not.
    for n in sorted({s for s in world_sizes if s == 3} | {max(world_sizes)}):
        for sp, divisible in ((False, True), (False, False), (True, True), (True, False)):
            check(n, sp, _corner_dims(kind, n, sp, divisible), divisible, n)

    # Half the profile's budget (ci 50, thorough 250): 18 properties of DTensor/megatron layers were the
    # default run's largest cost (~110 s of 10 min at 250); each example already draws tp, sequence
    # parallelism and divisible or not, and the corners above run first.
    @settings(max_examples=max(10, settings.default.max_examples // 2))
    @given(st.data())
    def prop(data):
        n = data.draw(st.sampled_from(world_sizes), label="tp")
        sp = data.draw(st.booleans(), label="sequence_parallel")
        dims, divisible = _dims(data, kind, n, sp)
        note = check(n, sp, dims, divisible, data.draw(st.integers(0, 999), label="seed"))
        if note:
            event(note)

    prop()
    assert conformance.counts.get("pass", 0) > 0, f"{tensor_parallel_impl} {kind}: no example was checked"
    conformance.settle()


def test_trained_block_equals_dense(tensor_parallel_impl, world_cache, world_sizes):
    """3 SGD-with-momentum steps of a sharded Linear-GELU-Linear block follow the dense block: losses
    and the trained block's outputs within the bound derived in ranks.train_block."""
    for n in world_sizes:
        hidden, ffn = 2 * n, 4 * n
        for r in world_cache.get(n).run(ranks.train_block, tensor_parallel_impl, 2, 2, hidden, ffn, 3, 3):
            if "unsupported" in r:
                continue
            assert r["diff"] <= r["bound"], (n, r)
            for a, b in zip(r["losses"]["sharded"], r["losses"]["dense"], strict=True):
                assert abs(a - b) <= r["bound"] * (1 + abs(b)), (n, r["losses"])
            assert r["losses"]["dense"][-1] < r["losses"]["dense"][0]  # it did train


def test_an_implementation_that_raises_is_a_failure_with_its_detail(world_cache, world_sizes):
    n = max(world_sizes)
    per_rank = world_cache.get(n).run(contract_ranks.contract_case, "suites.tensor_parallel.planted:RaisesInFullGrads",
                                      "column", (2, 2, 3, 2 * n), 0, False)
    assert all(r["problems"] == ["full_grads raised RuntimeError: gradients not gathered yet"] for r in per_rank)


def test_one_rank_raising_is_a_fail_naming_that_rank(world_cache, world_sizes):
    """The last rank's forward raises while its peers block in the row layer's all-reduce: the verdict is
    that rank's exception, its peers ended after the World's grace."""
    n = 3 if 3 in world_sizes else max(world_sizes)
    if n < 2:
        pytest.skip("needs two ranks")
    per_rank = run_or_fail(world_cache.get(n), contract_ranks.contract_case,
                           "suites.tensor_parallel.planted:LastRankRaisesInForward", "row", (2, 2, 2 * n, 3), 0, False,
                           failed=lambda detail: {"problems": [detail]})
    problems = {p for r in per_rank for p in r["problems"]}
    assert len(problems) == 1, problems
    (line,) = problems
    assert line.startswith(f"rank {n - 1}: the sharded module's forward or backward raised ValueError: features not "
                           "divisible on the last rank") and "still inside the code under test" in line, line
