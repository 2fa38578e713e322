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


def judged(conformance, r: dict, impl: str, n: int, label: str) -> None:
    """Record a merged ZeRO verdict ``r`` of one case and hold it: skipped (with the implementation's sentence) where
    unsupported, a failure where it refused a case that fits or where any rank found a problem."""
    if r["refused"]:
        conformance.record("unsupported" if r["unsupported"] else "refused", suite="zero", world_size=n,
                           collective=label, impl=impl, detail=r["refused"])
        assert r["unsupported"], f"{label}: refused a case that fits: {r['refused']}"
        pytest.skip(f"{impl} does not provide this case: {r['refused']}")
    conformance.record("fail" if r["problems"] else "pass", suite="zero", world_size=n, dtype=r["dtype"],
                       collective=label, numel=r["numel"], impl=impl, max_rel_err=r["worst"],
                       detail=" | ".join(r["problems"][:1]))
    assert not r["problems"], r["problems"][:4]
