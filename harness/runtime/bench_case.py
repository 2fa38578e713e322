"""One benchmark case's World call, and the status its ranks' answers give the case's row.

A bench's rank function turns an implementation's refusal (``NotImplementedError``, ``ValueError``, ``Unsupported``)
into ``{"unsupported": sentence}``; anything else it does — a raise, a rank dying, a hang — ends the World call.
``call_case`` makes that the case's verdict instead of the sweep's end (``harness.runtime.world.run_or_fail``, as a
suite's ``fail``): every rank's answer is ``{"failed": line}`` (the failing rank's own failure first), the World is
respawned on the next call (``World._fail``), and the sweep goes on with its next case. ``declined`` reads the row's
status from the answers: ``failed`` before ``unsupported``, nothing where every rank finished; ``judge`` gives a timed
row the suite's verdict of its case."""

from __future__ import annotations

import sys

from harness.runtime.world import run_or_fail


class _Stderr:
    """``sys.stderr`` as it is when written to, not when a module was imported (a sweep's ``progress`` default: a
    test that captured stderr while the module was first imported closes that stream afterwards)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


STDERR = _Stderr()
"""Every sweep's default ``progress``."""


def call_case(world, fn, *args, timeout: float = 600, log=STDERR, **kwargs) -> list[dict]:
    """``world.run(fn, *args, **kwargs)``; where a rank raised, died or hung, every rank's answer is
    ``{"failed": the verdict line}`` and the whole failure (each rank's traceback or stack) goes to ``log``."""
    return run_or_fail(world, fn, *args, failed=lambda line: {"failed": line}, timeout=timeout,
                       told=lambda failure: _log(failure, log), **kwargs)


def failed_in_driver(exc: BaseException, log=STDERR) -> dict:
    """A sweep that runs the implementation in the driver (``bench checkpoint``): its exception as the row's status
    and detail ("raised RuntimeError: ..."), its traceback to ``log`` — call it in the ``except`` block."""
    import traceback

    from harness.errors import describe

    _log(traceback.format_exc(), log)
    return {"status": "failed", "detail": f"raised {describe(exc)}"}


def _log(failure: str, log) -> None:
    print(f"paritybench: a case failed, the sweep goes on: {failure}", file=log, flush=True)


def declined(per_rank: list[dict]) -> dict:
    """``{"status": "failed" | "unsupported", "detail": ...}`` for a case that did not run to the end (the first
    rank's sentence: ranks refuse alike), ``{}`` where every rank returned its measurements."""
    for status in ("failed", "unsupported"):
        said = [r[status] for r in per_rank if r.get(status)]
        if said:
            return {"status": status, "detail": said[0]}
    return {}


def problems_of(verdict: list[dict]) -> list[str]:
    """Every rank's problems in the suite's verdict of a case (``{"problems": [...]}`` per rank), in rank order."""
    return [p for r in verdict for p in r.get("problems") or []]


def judge(row: dict, verdict: list[dict], known=None) -> dict:
    """A timed row given the suite's verdict of its case (every rank's ``{"problems": [...]}``): status ``wrong``,
    ``wrong`` 1 and the first problem ahead of ``detail`` where a rank found one — the gate reads the status, an ok
    case now wrong is its regression — else ``wrong`` 0. ``known``: the registered finding that explains the
    problems (``harness.records.findings.match``), named first — still wrong, as the suite's row is a finding, not a
    pass. Returns the row."""
    from harness.records.findings import detail_with

    problems = problems_of(verdict)
    row["wrong"] = int(bool(problems))
    if problems:
        row.update(status="wrong", detail=detail_with(known, "; ".join(filter(None, [problems[0], row.get("detail")]))))
    return row


__all__ = ["STDERR", "call_case", "declined", "failed_in_driver", "judge", "problems_of"]
