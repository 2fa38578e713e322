"""Every collective of every implementation equals the exact oracle (harness/collectives/case.py).

Hypothesis draws the world size, subgroup, dtype, op, numel, root, in-place flag and seed on the
driver; each example runs once on a shared World. Outputs are compared bitwise (AVG: within 1 ulp of
the exact quotient). A failure shrinks to the smallest case and prints it in one line.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from .property import check_collective


def test_collective_matches_exact_oracle(collectives_impl, collective_name, world_cache, world_sizes,
                                         conformance):
    check_collective(collectives_impl, collective_name, world_cache, world_sizes, conformance)


@pytest.mark.parametrize("collective_name", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("variant", ["ring_small_pieces", "ring_unpipelined"])
def test_ring_variants(variant, collective_name, world_cache, world_sizes, conformance):
    """The ring cut into 12-byte pieces (up to ~100 pieces per chunk, chunks of 0, 1 or several
    pieces), and the ring with one grouped exchange per step (nccl's path), each loaded as a user's
    package.module:object would be. Larger tensors would only add time; half the profile's budget, as the
    ring itself is already held to the whole of it."""
    check_collective(f"suites.collectives.impls:{variant}", collective_name, world_cache,
                     world_sizes, conformance, numels=st.integers(0, 1200), share=0.5)
