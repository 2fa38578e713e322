"""The conformance property, shared by the suites that hold an implementation to the exact oracle."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from harness.collectives.case import IN_PLACE_OPTIONAL, REDUCING, ROOTED, Case, merge, run_case
from harness.errors import HarnessError
from harness.runtime.world import run_or_fail

from .strategies import NUMELS, cases


def verdict(world_cache, n: int, case) -> dict:
    """Run one case on the shared World of size n; one merged verdict. A rank that dies or hangs in the
    code under test (its peers then stuck in the collective) is a failure with the World's account of it."""
    failed = {"outcome": "fail", "wrong": 0, "detail": ""}
    return merge(run_or_fail(world_cache.get(n), run_case, case, timeout=120,
                             failed=lambda detail: {**failed, "detail": detail}))


def corner_cases(impl: str, collective: str, world_sizes: list[int]) -> list[tuple[int, Case]]:
    """The classic corners, run before any random draw so that every profile covers them: world size 3
    (not a power of two) and the largest; numel 0, 1, below the world size, a prime; float64 and the
    lowest precision (bfloat16); AVG and PRODUCT; the last rank as root; in place; a subgroup that leaves
    out rank 0 (group ranks differ from global ranks)."""
    sizes = sorted({s for s in world_sizes if s == 3} | {max(world_sizes)})
    reducing = collective in REDUCING
    out = []
    for n in sizes:
        def case(numel, dtype="float32", op="sum", in_place=False, group=None, n=n):
            members = len(group) if group else n
            return n, Case(impl, collective, dtype, numel, op if reducing else "sum",
                           members - 1 if collective in ROOTED else 0,
                           in_place and collective in IN_PLACE_OPTIONAL, group, seed=n)
        out += [case(0), case(1), case(max(n - 1, 1), "float64"), case(7, "bfloat16"), case(13, in_place=True)]
        if reducing:
            out += [case(5, "float32", "avg"), case(3, "float64", "product")]
        if n >= 3:
            out.append(case(5, group=tuple(range(1, n))))
    return out


def check_collective(impl: str, collective: str, world_cache, world_sizes, conformance, numels=NUMELS,
                     share: float = 1.0) -> None:
    """The corners (``corner_cases``), then the hypothesis property over ``share`` of the profile's example
    budget: every case passes (or is reported unsupported); some case passes."""

    def check(n: int, case: Case) -> dict:
        result = verdict(world_cache, n, case)
        conformance.record(result["outcome"], suite="collectives", backend=world_cache.get(n).backend,
                           world_size=n, wrong=result["wrong"], detail=result["detail"], **case.as_row())
        if result["outcome"] == "error":
            raise HarnessError(f"{case.line(n)}: {result['detail']}")
        assert result["outcome"] in ("pass", "unsupported"), f"{case.line(n)}: {result['detail']}"
        return result

    for n, case in corner_cases(impl, collective, world_sizes):
        check(n, case)

    @settings(max_examples=max(5, int(settings.default.max_examples * share)))
    @given(data=st.data())
    def prop(data):
        result = check(*data.draw(cases(impl, collective, world_sizes, numels), label="case"))
        if result["outcome"] == "unsupported":
            event(f"unsupported: {result['detail']}")

    prop()
    # An implementation that declines everything must not pass by default.
    assert conformance.counts.get("pass", 0) > 0, (
        f"{impl} {collective}: every example was unsupported, nothing was checked")
