"""The reference tensor-parallel layers equal their dense twins (exact tier for the linear layers and
the embedding, bounds derived next to the check for GeLU and cross-entropy); shapes that do not divide
are refused in one sentence, a vocabulary that does not divide is padded and stays exact."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harness.tensor_parallel import layer_case as ranks


def _run(world_cache, n, fn, *args):
    problems = [p for rank_problems in world_cache.get(n).run(fn, *args) for p in rank_problems]
    assert not problems, f"{fn.__name__}{args} on {n} ranks: {problems[:3]}"


@given(st.data())
def test_column_and_row_parallel_linear_are_bit_exact(world_cache, world_sizes, data):
    n = data.draw(st.sampled_from(world_sizes), label="tp")
    kind = data.draw(st.sampled_from(["column", "row"]), label="kind")
    sp = data.draw(st.booleans(), label="sequence_parallel")
    flag = data.draw(st.booleans(), label="gather_output / input_is_parallel")
    seq = n * data.draw(st.integers(1, 3), label="seq per rank")
    in_f = (n if kind == "row" else 1) * data.draw(st.integers(1, 6), label="in")
    out_f = (n if kind == "column" else 1) * data.draw(st.integers(1, 6), label="out")
    dtype = data.draw(st.sampled_from(["float32", "float64"]), label="dtype")
    if kind == "column" and sp and flag:
        flag = False  # gathering the output of a sequence-parallel column layer is not a Megatron layout
    _run(world_cache, n, ranks.linear_pair, kind, seq, data.draw(st.integers(1, 3)), in_f, out_f,
         data.draw(st.integers(0, 999)), dtype, flag, sp)


@given(st.data())
def test_parallel_mlp_within_derived_bound(world_cache, world_sizes, data):
    n = data.draw(st.sampled_from(world_sizes), label="tp")
    _run(world_cache, n, ranks.mlp, n * data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2)),
         data.draw(st.integers(1, 6)), n * data.draw(st.integers(1, 6)), data.draw(st.integers(0, 999)),
         data.draw(st.booleans(), label="sequence_parallel"))


@given(st.data())
def test_vocab_parallel_embedding_exact_even_when_vocab_does_not_divide(world_cache, world_sizes, data):
    n = data.draw(st.sampled_from(world_sizes), label="tp")
    _run(world_cache, n, ranks.embedding, data.draw(st.integers(1, 23), label="vocab"),
         data.draw(st.integers(1, 5)), data.draw(st.integers(0, 12)), data.draw(st.integers(0, 999)))


@given(st.data())
def test_vocab_parallel_cross_entropy_within_derived_bound(world_cache, world_sizes, data):
    n = data.draw(st.sampled_from(world_sizes), label="tp")
    _run(world_cache, n, ranks.cross_entropy, data.draw(st.integers(1, 9)), data.draw(st.integers(1, 23)),
         data.draw(st.integers(0, 999)), data.draw(st.booleans(), label="padded"))


def test_sizes_that_do_not_divide_are_refused(world_cache, world_sizes):
    n = max(world_sizes)
    if n < 2:
        return
    messages = world_cache.get(n).run(ranks.bad_shape, 2 * n + 1)
    assert all(f"out_features ({2 * n + 1}) must divide by the tensor-parallel size ({n})" in m for m in messages)


def test_a_missing_backward_all_reduce_is_caught(world_cache, world_sizes):
    n = max(world_sizes)
    if n < 2:
        return
    per_rank = world_cache.get(n).run(ranks.planted_column, 2, 3, 2 * n)
    assert all(problems and all(p.startswith("input grad") for p in problems) for problems in per_rank), per_rank


@given(st.data())
def test_parallel_attention_within_derived_bound(world_cache, world_sizes, data):
    n = data.draw(st.sampled_from(world_sizes), label="tp")
    _run(world_cache, n, ranks.attention, n * data.draw(st.integers(1, 2), label="seq per rank"),
         data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2), label="heads per rank"),
         data.draw(st.integers(1, 4), label="head dim"), data.draw(st.integers(0, 999)),
         data.draw(st.booleans(), label="sequence_parallel"))
