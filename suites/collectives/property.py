"""The conformance property, shared by the suites that hold an implementation to the exact oracle."""

from __future__ import annotations

from hypothesis import event, given
from hypothesis import strategies as st

from harness.collectives.case import merge, run_case
from harness.world import RankFailure

from .strategies import NUMELS, cases


def verdict(world_cache, n: int, case) -> dict:
    """Run one case on the shared World of size n; one merged verdict. A rank that dies or hangs in the
    code under test (its peers then stuck in the collective) is a failure with the World's account of it."""
    try:
        return merge(world_cache.get(n).run(run_case, case, timeout=120))
    except RankFailure as exc:
        return {"outcome": "fail", "wrong": 0, "detail": str(exc).splitlines()[0]}


def check_collective(impl: str, collective: str, world_cache, world_sizes, conformance, numels=NUMELS) -> None:
    """Hypothesis property: every drawn case passes (or is reported unsupported); some case passes."""

    @given(data=st.data())
    def prop(data):
        n, case = data.draw(cases(impl, collective, world_sizes, numels), label="case")
        result = verdict(world_cache, n, case)
        conformance.record(result["outcome"], suite="collectives", backend=world_cache.get(n).backend,
                           world_size=n, wrong=result["wrong"], detail=result["detail"], **case.as_row())
        if result["outcome"] == "unsupported":
            event(f"unsupported: {result['detail']}")
            return
        assert result["outcome"] == "pass", f"{case.line(n)}: {result['detail']}"

    prop()
    # An implementation that declines everything must not pass by default.
    assert conformance.counts.get("pass", 0) > 0, (
        f"{impl} {collective}: every example was unsupported, nothing was checked")
