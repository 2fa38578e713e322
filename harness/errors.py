"""The CLI's error for bad input: its message is the one sentence the user sees (exit code 2)."""


class UsageError(ValueError):
    """A bad input: the message is the one sentence the user sees."""


class HarnessError(RuntimeError):
    """A bug of paritybench's own (its oracle or machinery) while checking an implementation: outcome
    ``error``, never confused with the implementation failing."""
