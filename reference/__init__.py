"""Reference implementations of the parallelism primitives: clean, readable, held to single-device."""

from . import aliases as _aliases  # noqa: F401 - the moved modules' old names stay importable
