"""Hypothesis strategies for collectives cases, drawn on the driver (shrinking toward small cases)."""

from __future__ import annotations

from hypothesis import strategies as st

from harness.collectives.case import DTYPES, IN_PLACE_OPTIONAL, OPS, REDUCING, ROOTED, Case

# Edge sizes first (0, 1, primes, below any world size), then anything up to ~4K, then large ones that
# span several ring pieces; hypothesis shrinks toward the first branch's first values.
NUMELS = st.one_of(
    st.sampled_from([0, 1, 2, 3, 5, 7, 13, 31, 127, 257, 1021]),
    st.integers(0, 4099),
    st.sampled_from([65537, 300007]),
)


@st.composite
def cases(draw, impl: str, collective: str, world_sizes: list[int], numels=NUMELS) -> tuple[int, Case]:
    """(world size, Case) for one collective of one implementation, over everything else."""
    n = draw(st.sampled_from(sorted(world_sizes)))
    group = None
    if n > 1:
        subsets = st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True).map(lambda r: tuple(sorted(r)))
        group = draw(st.one_of(st.none(), subsets))
    members = len(group) if group else n
    return n, Case(
        impl=impl,
        collective=collective,
        dtype=draw(st.sampled_from(DTYPES)),
        numel=draw(numels),
        op=draw(st.sampled_from(OPS)) if collective in REDUCING else "sum",
        root=draw(st.integers(0, members - 1)) if collective in ROOTED else 0,
        in_place=draw(st.booleans()) if collective in IN_PLACE_OPTIONAL else False,
        group=group,
        seed=draw(st.integers(0, 2**16)),
    )
