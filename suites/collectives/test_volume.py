"""Each reference algorithm sends exactly the bytes its docstring's formula says.

The byte counts come from the algorithms themselves (every send is counted in ``Peers``); the
formulas below are the docstrings' (S = whole buffer bytes, N ranks), made exact per rank where the
chunking is deterministic.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reference.collectives import chunk_bounds

from .ranks import bytes_sent
from .strategies import NUMELS

ALGORITHMS = ["ring_all_reduce", "rhd_all_reduce", "tree_all_reduce", "naive_all_reduce",
              "ring_reduce_scatter", "ring_all_gather", "tree_broadcast", "tree_reduce", "pairwise_all_to_all"]
ELEM = {"float32": 4, "float64": 8, "float16": 2, "int64": 8}


def tree_children(v: int, n: int) -> int:
    """Children of relative rank v in the binomial tree: v + 2^k for every 2^k > v with v + 2^k < n."""
    count, mask = 0, 1
    while mask < n:
        count += v < mask and v + mask < n
        mask <<= 1
    return count


def expected_bytes(algorithm: str, n: int, numel: int, elem: int, root: int) -> list[int] | None:
    """Exact bytes per rank, or None where only the total and a bound are exact (rhd)."""
    s = numel * elem
    if n == 1 or numel == 0:
        return [0] * n
    if algorithm == "ring_all_reduce":  # every chunk twice except (r+1) in RS and (r+2) in AG
        sizes = [hi - lo for lo, hi in chunk_bounds(numel, n)]
        return [elem * (2 * numel - sizes[(r + 1) % n] - sizes[(r + 2) % n]) for r in range(n)]
    if algorithm in ("ring_reduce_scatter", "ring_all_gather", "pairwise_all_to_all"):
        return [(n - 1) * s] * n  # numel is the per-rank block here: (N-1)/N of the whole N*block
    if algorithm == "tree_broadcast":
        return [tree_children((r - root) % n, n) * s for r in range(n)]
    if algorithm == "tree_reduce":
        return [0 if r == root else s for r in range(n)]
    if algorithm == "tree_all_reduce":
        return [(0 if r == 0 else s) + tree_children(r, n) * s for r in range(n)]
    if algorithm == "naive_all_reduce":
        return [(n - 1) * s if r == 0 else s for r in range(n)]
    return None


@given(data=st.data())
def test_bytes_sent_match_the_formula(world_cache, world_sizes, data):
    algorithm = data.draw(st.sampled_from(ALGORITHMS), label="algorithm")
    n = data.draw(st.sampled_from(world_sizes), label="world_size")
    numel = data.draw(NUMELS, label="numel")
    dtype = data.draw(st.sampled_from(sorted(ELEM)), label="dtype")
    root = data.draw(st.integers(0, n - 1), label="root")
    # Tiny pieces only on small tensors: 300007 elements in 4-byte pieces is 10^5 sends, no new case.
    pieces = [None, 0, 4, 64] if numel <= 5000 else [None, 0]  # 0: one grouped exchange per step
    piece = data.draw(st.sampled_from(pieces), label="piece_bytes")
    got = world_cache.get(n).run(bytes_sent, algorithm, numel, dtype, root, piece)
    elem, s = ELEM[dtype], numel * ELEM[dtype]
    line = f"{algorithm} n={n} numel={numel} dtype={dtype} root={root} piece_bytes={piece}: sent {got}"
    want = expected_bytes(algorithm, n, numel, elem, root)
    if want is not None:
        assert got == want, f"{line}, formula {want}"
    if algorithm in ("ring_all_reduce", "rhd_all_reduce") and n > 1:
        assert sum(got) == 2 * (n - 1) * s, f"{line}: total must be exactly 2(N-1)S = {2 * (n - 1) * s}"
    if algorithm == "ring_all_reduce" and n > 1:  # 2(N-1) chunks of floor or ceil(numel/N) elements
        lo, hi = 2 * (n - 1) * (numel // n) * elem, 2 * (n - 1) * -(-numel // n) * elem
        assert all(lo <= b <= hi for b in got), f"{line}: outside [{lo}, {hi}]"
    if algorithm == "rhd_all_reduce" and n > 1 and numel:
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        for r, b in enumerate(got):
            if r < 2 * extra and r % 2 == 0:
                assert b == s, f"{line}: a folded rank sends its vector once"
            else:
                # 2(P-1)/P * S, plus S for an unfolding odd rank; each of the 2 log2 P steps sends
                # P/2^j blocks that are each within one element of numel/P: < 2P elements off in all.
                ideal = 2 * (p - 1) * s / p + (s if r < 2 * extra else 0)
                assert abs(b - ideal) < 2 * p * elem, f"{line}: rank {r} far from {ideal}"
