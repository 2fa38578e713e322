"""What the ZeRO test files share: which stages an implementation owns, and the sizes a third party runs."""

from __future__ import annotations

import pytest

from harness.records import registry


def skip_unless_stage(impl: str, stage: int) -> None:
    spec = registry.resolve(impl, "zero")
    if not spec.owns(f"stage{stage}"):
        pytest.skip(f"{impl} is a stage-0 variant ({', '.join(spec.only_ops)})")


THIRD_PARTY_SIZES = (2, 3)
"""A third party's table in every profile: dp 2 and 3 — the even and the uneven shard count over the 43-element
prime model (every shard boundary padded); dp 1 (nothing to shard) and 4 (even again) in the thorough env. Ours
runs every size everywhere (its planted bugs are caught at these sizes: the mutation table)."""
