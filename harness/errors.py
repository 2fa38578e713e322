"""The CLI's error for bad input: its message is the one sentence the user sees (exit code 2)."""


class UsageError(ValueError):
    """A bad input: the message is the one sentence the user sees."""


def describe(exc: BaseException) -> str:
    """An exception in one line for a verdict's detail: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


class HarnessError(RuntimeError):
    """A bug of paritybench's own (its oracle or machinery) while checking an implementation: outcome
    ``error``, never confused with the implementation failing."""
