"""Parsing command-line values; each bad value is one sentence naming it and what is valid."""

from __future__ import annotations

import re
from pathlib import Path

from harness.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
          "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(text: str) -> int:
    """'1024', '1K', '64M', '64MiB', '1GB' -> bytes (K/M/G are binary, as in nccl-tests; KB/MB/GB decimal)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"size {text!r} is not a byte count; use e.g. 1024, 8K, 64M, 1G, 64MiB or 1GB.")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def output_path(text: str, option: str, folder: bool = False) -> Path:
    """Where a command writes at its end (``option``'s value), checked before any of its work: a file — or, with
    ``folder``, a folder — that can be made there: not an existing folder where a file is asked (nor a file where a
    folder is), not under a file, a file creatable in its nearest existing parent (a probe, created and removed:
    permissions, a read-only or special filesystem). One sentence otherwise; returns the path."""
    import tempfile

    path = Path(text).expanduser()
    if path.is_dir() != folder and path.exists():
        raise UsageError(f"{option} {text!r} is {'a file' if folder else 'a folder'}; give "
                         f"{'a folder' if folder else 'the file to write'}.")
    nearest = next(p for p in (path if folder else path.parent, *path.parents) if p.exists() or p == Path(p.anchor))
    if not nearest.is_dir():
        raise UsageError(f"{option} {text!r} cannot be written: {str(nearest)!r} is a file, not a folder.")
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {text!r} cannot be written: no file can be made in {str(nearest)!r} "
                         f"({exc.strerror or exc}).") from None
    return path


def parse_list(text: str, valid: tuple[str, ...], what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if bad or not items:
        raise UsageError(f"{what} {', '.join(bad) or repr(text)} not known; choose from {', '.join(valid)}.")
    return items


def device_world_sizes(devices: int) -> list[int]:
    """The world sizes a node with ``devices`` GPUs runs by default: 1, 2, 3 (a non-power of two catches
    chunking bugs), every power of two up to ``devices``, and ``devices`` itself."""
    sizes = {1, 2, 3, devices} | {1 << k for k in range(devices.bit_length())}
    return sorted(s for s in sizes if 1 <= s <= devices)


def auto_world_sizes(backend: str | None, cpu_default: str, minimum: int = 1) -> list[int]:
    """``--world-sizes auto``: under torchrun the job's size; on a node where the backend is (or would
    be) nccl, ``device_world_sizes(torch.cuda.device_count())`` from ``minimum`` up; else ``cpu_default``."""
    from harness.runtime import spmd_runtime as spmd

    if spmd.active():
        return [spmd.world_size()]
    if backend != "gloo":
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= 1:
            sizes = [s for s in device_world_sizes(torch.cuda.device_count()) if s >= minimum]
            return sizes or [torch.cuda.device_count()]
        if backend == "nccl":
            raise UsageError("--backend nccl needs CUDA devices, and none is visible here; "
                             "use --backend gloo or run on a GPU node.")
    return parse_world_sizes(cpu_default)


def parse_world_sizes(text: str, backend: str | None = None, cpu_default: str = "2,4", minimum: int = 1) -> list[int]:
    """'2,4' -> [2, 4]; 'auto' -> ``auto_world_sizes(backend, cpu_default, minimum)``."""
    if text.strip() == "auto":
        return auto_world_sizes(backend, cpu_default, minimum)
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--world-sizes {text!r} must be comma-separated whole numbers, e.g. 2,4.") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"--world-sizes {text!r}: every world size must be at least 1.")
    return sizes
