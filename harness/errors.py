"""The CLI's error for bad input: its message is the one sentence the user sees (exit code 2)."""


class UsageError(ValueError):
    """A bad input: the message is the one sentence the user sees."""


def describe(exc: BaseException) -> str:
    """An exception in one line for a verdict's detail: its type and the first line of its message that is not blank
    — and, where it was raised from another (``raise ... from``: torch's pipelining wraps a stage's error in "[Stage 0]
    failed to run forward:"), that one's, after "from"."""
    line = f"{type(exc).__name__}: {_first_line(exc)}"
    cause = exc.__cause__
    return line if cause is None else f"{line} from {type(cause).__name__}: {_first_line(cause)}"


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")


class HarnessError(RuntimeError):
    """A bug of paritybench's own (its oracle or machinery) while checking an implementation: outcome
    ``error``, never confused with the implementation failing."""
