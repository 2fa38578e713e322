"""The tensor-parallel contract catches the layers' classic arithmetic bugs, each exactly where it lives.

Each planted bug is the reference with one step changed (suites/tensor_parallel/planted.py), loaded by spec like a
user's implementation; the mutation check (suites/mutation.py) holds that the conformance property finds it. Here
each is held at its boundary on one case: it fails there, naming what differs, and the neighbouring case — one
condition changed, the one the bug needs — passes.
"""

from __future__ import annotations

import pytest

from harness.tensor_parallel import case as contract_ranks
from harness.verdict import reduce


def _problems(world_cache, impl: str, n: int, kind: str, dims: tuple, sp: bool) -> list[str]:
    per_rank = world_cache.get(n).run(contract_ranks.contract_case, f"suites.tensor_parallel.planted:{impl}", kind,
                                      dims, 0, sp)
    v = reduce(per_rank)
    assert v.outcome in ("pass", "fail"), (impl, kind, dims, sp, v.outcome, v.problems[:2])
    return v.problems


@pytest.fixture
def n(world_sizes) -> int:
    """tp: 3 where it is asked (the corners' odd size), else the largest; the bugs need two ranks."""
    if max(world_sizes) < 2:
        pytest.skip("needs two ranks")
    return 3 if 3 in world_sizes else max(world_sizes)


# (bug, kind, dims at tp n, sequence parallel, the problem's name, the neighbour: what it changes)
CASES = [
    ("RowBiasOnEveryRank", "row", lambda n: (2, 2, 2 * n, 3), False, "output", "tp 1"),
    ("RowBiasOnEveryRank", "mlp", lambda n: (2 * n, 2, 3, 2 * n), True, "output", "tp 1"),
    ("ColumnInputGradNotReduced", "column", lambda n: (2, 2, 3, 2 * n), False, "input grad", "sequence parallel"),
    ("EmbeddingNotMasked", "embedding", lambda n: (2, 2, 2 * n, 3), False, "output", "tp 1"),
    # the remainder's rows never get a gradient (seed 0 looks none of them up: its lookups are right)
    ("VocabRemainderDropped", "embedding", lambda n: (2, 2, 2 * n + 1, 3), False, "weight grad",
     "vocabulary divisible"),
    ("VocabRemainderDropped", "lm_head", lambda n: (2, 2, 3, 2 * n + 1), False, "loss", "vocabulary divisible"),
    ("CrossEntropyLocalMax", "lm_head", lambda n: (2, 2, 3, 2 * n), False, "loss", "tp 1"),
    ("SequenceParallelBiasPartial", "row", lambda n: (2 * n, 2, 2 * n, 3), True, "bias grad", "sequence parallel"),
    ("SequenceParallelBiasPartial", "attention", lambda n: (2 * n, 2, n, 2), True, "o.bias grad", "sequence parallel"),
]


@pytest.mark.parametrize("bug, kind, dims, sp, what, neighbour", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_planted_bug_fails_where_it_lives_and_its_neighbour_passes(bug, kind, dims, sp, what, neighbour, n,
                                                                      world_cache, world_sizes):
    problems = _problems(world_cache, bug, n, kind, dims(n), sp)
    assert any(p.startswith(f"{what}:") for p in problems), (bug, kind, problems[:3])
    if neighbour == "tp 1":  # one rank holds everything: no reduction, no other shard to get wrong
        if 1 not in world_sizes:
            return
        args = (1, kind, dims(1), sp)
    elif neighbour == "sequence parallel":  # the same layer the other way (its sequence 2 n long, or 2)
        args = (n, kind, (2 if sp else 2 * n, *dims(n)[1:]), not sp)
    else:  # the vocabulary one row shorter: divisible by n
        d = dims(n)
        args = (n, kind, (*d[:2], d[2] - 1, d[3]) if kind == "embedding" else (*d[:3], d[3] - 1), sp)
    assert _problems(world_cache, bug, *args) == [], (bug, neighbour, args)
