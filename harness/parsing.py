"""Parsing command-line values; each bad value is one sentence naming it and what is valid."""

from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
          "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(text: str) -> int:
    """'1024', '1K', '64M', '64MiB', '1GB' -> bytes (K/M/G are binary, as in nccl-tests; KB/MB/GB decimal)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"size {text!r} is not a byte count; use e.g. 1024, 8K, 64M, 1G, 64MiB or 1GB.")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_list(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise UsageError(f"{what} {', '.join(bad) or repr(text)} not known; choose from {', '.join(valid)}.")
    return items


def parse_world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--world-sizes {text!r} must be comma-separated whole numbers, e.g. 2,4.") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"--world-sizes {text!r}: every world size must be at least 1.")
    return sizes
