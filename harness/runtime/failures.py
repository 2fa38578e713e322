"""What a World call that did not come back is: a rank that raised or died (``RankFailure``), one that failed in the
code under test while its peers were stuck inside it (``ImplementationFailure``), a call past its deadline
(``WorldTimeout``) or one no rank progresses in (``WorldHang``) — and the one line a verdict carries for it."""

from __future__ import annotations


class RankFailure(RuntimeError):
    """One or more ranks raised or died.

    ``failures`` maps each failing rank -> its traceback (or how it died); ``stuck`` maps each other
    rank that was still blocked (typically in a collective with the failing one) -> its stack.
    """

    def __init__(self, message: str, failures: dict[int, str], stuck: dict[int, str] | None = None):
        self.failures = dict(sorted(failures.items()))
        self.stuck = dict(sorted((stuck or {}).items()))
        parts = [f"--- rank {r} ---\n{t.rstrip()}" for r, t in self.failures.items()]
        parts += [f"--- rank {r} (stuck) ---\n{t.rstrip()}" for r, t in self.stuck.items()]
        super().__init__("\n".join([message, *parts]))

    @property
    def ranks(self) -> list[int]:
        """The failing ranks (for ``WorldTimeout``: the ranks that never returned)."""
        return list(self.failures)


class ImplementationFailure(RankFailure):
    """A rank's case had its verdict from the code under test's own failure (``harness.runtime.rank.
    failed_in_implementation``) while its peers were still blocked inside the code under test: they were
    ended after the peer grace instead of at the deadline. ``failures`` maps each such rank -> its verdict
    line, ``stuck`` the ended ranks -> their stacks, ``results`` the ranks that returned -> their results.
    The message's first line is the verdict: "rank 2: raised ValueError: ..."."""

    def __init__(self, message: str, failures: dict[int, str], stuck: dict[int, str], results: dict):
        super().__init__(message, failures, stuck)
        self.results = dict(results)


def _first_errors(errors: dict[int, str]) -> str:
    """'rank 2: ValueError: odd length' — each failing rank's exception line (a traceback's last line)."""
    return "; ".join(f"rank {r}: {(t.strip().splitlines() or ['?'])[-1]}" for r, t in sorted(errors.items()))


class WorldTimeout(RankFailure):
    """The call passed its deadline. ``failures`` maps each rank that never returned -> its stack."""


class WorldHang(WorldTimeout):
    """No rank still inside the call progressed for the hang window (``harness.runtime.hang``): a deadlock, ended
    before the deadline. The message's first line names the collective and the rank that never entered it."""


def verdict_of(exc: RankFailure) -> str:
    """The one line a conformance row and a test report carry for a call that failed on the World: the
    failing rank's own failure first ("rank 2: raised ValueError: ..."), then what became of its peers."""
    return str(exc).splitlines()[0]
