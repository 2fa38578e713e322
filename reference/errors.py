"""Errors shared by the reference implementations."""


class Unsupported(NotImplementedError):
    """The implementation does not support this operation (reported, never emulated)."""
