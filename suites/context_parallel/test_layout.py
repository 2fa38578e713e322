"""The sequence layouts (reference/context_parallel/layout.py) on their own, in process: every token on exactly one
rank, the zigzag's equal causal work, ``unshard`` the inverse of ``shard``, and a sequence or a layout they cannot
take refused in one sentence. Integer-valued tokens: every comparison exact."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.context_parallel import LAYOUTS, chunks, positions, shard, unshard


@st.composite
def splits(draw):
    cp = draw(st.integers(1, 6))
    layout = draw(st.sampled_from(LAYOUTS))
    parts = cp if layout == "contiguous" else 2 * cp
    return cp, layout, parts * draw(st.integers(1, 4))


@given(splits())
def test_every_token_is_on_exactly_one_rank_in_its_chunks_order(split):
    cp, layout, seq = split
    held = torch.cat([positions(seq, cp, r, layout) for r in range(cp)])
    assert torch.equal(held.sort().values, torch.arange(seq)), held
    for r in range(cp):
        assert torch.equal(positions(seq, cp, r, layout), torch.cat([torch.arange(a, b)
                                                                     for a, b in chunks(seq, cp, r, layout)]))


@given(splits())
def test_the_zigzag_gives_every_rank_the_same_causal_work_the_contiguous_does_not(split):
    """Causal work of a rank: the keys its queries see, sum over its tokens of (position + 1). The zigzag pairs chunk r
    with chunk 2 cp - 1 - r: equal on every rank. The contiguous split's last rank does exactly (cp - 1) n^2 more than
    its first (n tokens a rank): each of its n queries sees (cp - 1) n more keys."""
    cp, layout, seq = split
    work = [int((positions(seq, cp, r, layout) + 1).sum()) for r in range(cp)]
    if layout == "zigzag" or cp == 1:
        assert len(set(work)) == 1, work
    else:
        n = seq // cp
        assert work[-1] - work[0] == (cp - 1) * n * n, work


@given(splits(), st.integers(0, 2))
def test_unshard_puts_every_ranks_shard_back_where_it_came_from(split, dim):
    cp, layout, seq = split
    shape = [2, 3, 2]
    shape[dim] = seq
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    parts = [shard(x, cp, r, layout, dim=dim) for r in range(cp)]
    assert all(p.shape[dim] == seq // cp for p in parts)
    assert torch.equal(unshard(parts, layout, dim=dim), x)
    assert torch.equal(unshard(parts, layout, dim=dim - 3), x)  # a negative dim names the same one


@pytest.mark.parametrize("seq, cp, layout, said", [
    (10, 4, "contiguous", "a sequence of 10 tokens does not split into the 4 equal chunks the contiguous layout over "
                          "cp = 4 needs; pad it to a multiple of 4."),
    (12, 4, "zigzag", "a sequence of 12 tokens does not split into the 8 equal chunks the zigzag layout over cp = 4 "
                      "needs; pad it to a multiple of 8."),
    (8, 2, "striped", "layout must be one of contiguous, zigzag; got 'striped'."),
])
def test_a_sequence_or_layout_the_split_cannot_take_is_one_sentence(seq, cp, layout, said):
    with pytest.raises(ValueError) as info:
        chunks(seq, cp, 0, layout)
    assert str(info.value) == said
