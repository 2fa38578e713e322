"""The CLI's error for bad input: its message is the one sentence the user sees (exit code 2)."""


class UsageError(ValueError):
    """A bad input: the message is the one sentence the user sees."""
