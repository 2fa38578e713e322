"""Installed releases and their order: the one place findings (their ranges) and releases (the tested ones) read
them. Imports nothing of paritybench."""

from __future__ import annotations

import re
from importlib import metadata


def release(version: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '0.16.1rc1' -> (0, 16, 1)."""
    return tuple(int(m) for m in re.findall(r"\d+", version.split("+")[0].split("rc")[0].split("a")[0])[:3])


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
