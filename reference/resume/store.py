"""The resume format: per-rank shard files, one metadata file, atomic publication, box reads.

    <root>/latest                      the published step's folder name, replaced atomically
    <root>/<step>/metadata.json        {"format", "version", "tensors": {name: {"shape", "dtype",
                                        "shards": [{"owner", "file", "byte_offset", "offsets", "lengths",
                                                    "block_crc32"}]}}, "meta": {layout, versions, ...}}
    <root>/<step>/rank00003.bin        rank 3's shards, each C-contiguous, back to back

A crash at any point before ``publish``'s rename leaves only a staging folder (``.staging-*``) that no
reader looks at; before the ``latest`` replace, the previous step stays the one loaded. Every block of
``BLOCK`` bytes of every shard carries a CRC-32, checked on every read that touches it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy
import torch

from reference.files import atomic_write_text

FORMAT, VERSION, BLOCK = "paritybench-resume", 1, 1 << 16


class ResumeError(ValueError):
    """A checkpoint that cannot be read as asked; one sentence naming the file and the tensor."""


@dataclass(frozen=True)
class Shard:
    """The box of a global tensor one rank holds: ``tensor`` is global[offsets : offsets + tensor.shape]."""

    name: str
    tensor: torch.Tensor
    offsets: tuple[int, ...]
    global_shape: tuple[int, ...]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))


def write_rank(staging: Path, rank: int, shards: list[Shard]) -> list[dict]:
    """Write this rank's shards into ``staging/rank<r>.bin`` (fsynced) and its index ``rank<r>.json``."""
    staging = Path(staging)
    file = f"rank{rank:05d}.bin"
    index, offset = [], 0
    with open(staging / file, "wb") as f:
        for s in shards:
            if len(s.offsets) != len(s.global_shape) or s.tensor.dim() != len(s.global_shape):
                raise ResumeError(f"shard of {s.name!r}: offsets {s.offsets}, shape {tuple(s.tensor.shape)} and "
                                  f"global shape {s.global_shape} must have the same number of dimensions.")
            if any(o < 0 or o + n > g for o, n, g in zip(s.offsets, s.tensor.shape, s.global_shape, strict=True)):
                raise ResumeError(f"shard of {s.name!r} at {s.offsets} of shape {tuple(s.tensor.shape)} lies outside "
                                  f"the global shape {s.global_shape}.")
            data = s.tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            f.write(data)
            index.append({"name": s.name, "shape": list(s.global_shape), "dtype": str(s.tensor.dtype).split(".")[-1],
                          "owner": rank, "file": file, "byte_offset": offset, "offsets": list(s.offsets),
                          "lengths": list(s.tensor.shape),
                          "block_crc32": [zlib.crc32(data[i:i + BLOCK]) for i in range(0, len(data), BLOCK)]})
            offset += len(data)
        f.flush()
        os.fsync(f.fileno())
    _write_json(staging / f"rank{rank:05d}.json", index)
    return index


def finalize(staging: Path, world_size: int, meta: dict) -> dict:
    """Rank 0, after every rank wrote: merge the indexes into metadata.json. Every tensor must be covered
    whole (replicated boxes are kept once, from the lowest rank); returns the metadata."""
    staging = Path(staging)
    tensors: dict[str, dict] = {}
    for rank in range(world_size):
        path = staging / f"rank{rank:05d}.json"
        if not path.is_file():
            raise ResumeError(f"rank {rank} wrote no index ({path.name}): the save is incomplete.")
        for e in json.loads(path.read_text()):
            t = tensors.setdefault(e["name"], {"shape": e["shape"], "dtype": e["dtype"], "shards": []})
            if (t["shape"], t["dtype"]) != (e["shape"], e["dtype"]):
                raise ResumeError(f"{e['name']!r}: rank {rank} holds it as {e['dtype']} {e['shape']}, another rank "
                                  f"as {t['dtype']} {t['shape']}.")
            if not any(s["offsets"] == e["offsets"] and s["lengths"] == e["lengths"] for s in t["shards"]):
                t["shards"].append({k: e[k] for k in ("owner", "file", "byte_offset", "offsets", "lengths",
                                                      "block_crc32")})
    for name, t in tensors.items():
        covered = sum(math.prod(s["lengths"]) for s in t["shards"])
        if covered != math.prod(t["shape"]):
            raise ResumeError(f"{name!r}: the shards cover {covered} of its {math.prod(t['shape'])} elements "
                              "(overlapping or missing boxes).")
    metadata = {"format": FORMAT, "version": VERSION, "tensors": tensors, "meta": meta}
    _write_json(staging / "metadata.json", metadata)
    _fsync_dir(staging)
    return metadata


def publish(root: Path, step: str, staging: Path) -> Path:
    """Rank 0: rename the finished staging folder to ``root/step``, then point ``latest`` at it."""
    root, final = Path(root), Path(root) / step
    if final.exists():
        raise ResumeError(f"{str(final)!r} already exists: a published step is never overwritten.")
    os.rename(staging, final)
    _fsync_dir(root)
    atomic_write_text(root / "latest", step + "\n")
    _fsync_dir(root)
    return final


def latest(root: Path) -> Path:
    """The published step ``root/latest`` points at."""
    pointer = Path(root) / "latest"
    if not pointer.is_file():
        raise ResumeError(f"{str(root)!r} has no published checkpoint (no 'latest' file).")
    step = Path(root) / pointer.read_text().strip()
    if not (step / "metadata.json").is_file():
        raise ResumeError(f"{str(pointer)!r} points at {step.name!r}, which has no metadata.json.")
    return step


def read_metadata(ckpt: Path) -> dict:
    path = Path(ckpt) / "metadata.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ResumeError(f"cannot read {str(path)!r}: {exc.strerror or exc}.") from None
    except json.JSONDecodeError as exc:
        raise ResumeError(f"{str(path)!r} is not valid JSON ({exc.msg}, line {exc.lineno}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ResumeError(f"{str(path)!r} is not a {FORMAT} checkpoint of version {VERSION}.")
    return data


def read_box(ckpt: Path, name: str, offsets, lengths, dtype: torch.dtype | None = None, metadata: dict | None = None,
             global_shape=None) -> torch.Tensor:
    """global[name][offsets : offsets + lengths], read from the shards that intersect it (only the bytes
    needed, each touched block's CRC checked). ``dtype`` / ``global_shape``: what the caller expects."""
    ckpt = Path(ckpt)
    metadata = metadata or read_metadata(ckpt)
    t = metadata["tensors"].get(name)
    if t is None:
        raise ResumeError(f"{str(ckpt)!r} has no tensor {name!r}: its {len(metadata['tensors'])} tensors "
                          f"(e.g. {next(iter(metadata['tensors']), 'none')!r}) are another model's.")
    stored = getattr(torch, t["dtype"])
    if dtype is not None and dtype != stored:
        raise ResumeError(f"{name!r} is stored as {t['dtype']}; {str(dtype).split('.')[-1]} was asked for.")
    if global_shape is not None and list(global_shape) != t["shape"]:
        raise ResumeError(f"{name!r} is stored with global shape {t['shape']}; the model has {list(global_shape)}.")
    if len(offsets) != len(t["shape"]) or any(o < 0 or o + n > g for o, n, g in zip(offsets, lengths, t["shape"],
                                                                                    strict=True)):
        raise ResumeError(f"box {list(offsets)} + {list(lengths)} lies outside {name!r}'s shape {t['shape']}.")
    out = torch.empty(list(lengths), dtype=stored)
    flat = out.view(-1).view(torch.uint8).numpy()
    item, filled = out.element_size(), 0
    for s in t["shards"]:
        lo = [max(o, q) for o, q in zip(s["offsets"], offsets, strict=True)]
        hi = [min(o + n, q + m) for o, n, q, m in zip(s["offsets"], s["lengths"], offsets, lengths, strict=True)]
        if any(a >= b for a, b in zip(lo, hi, strict=True)):
            continue
        filled += _copy_intersection(ckpt, name, s, lo, hi, offsets, lengths, item, flat)
    if filled != out.numel():
        raise ResumeError(f"{name!r}: the shards of {str(ckpt)!r} cover {filled} of the {out.numel()} elements "
                          f"asked for (box {list(offsets)} + {list(lengths)}): a shard is missing.")
    return out


def _strides(shape) -> list[int]:
    out, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out[d], acc = acc, acc * shape[d]
    return out


def _copy_intersection(ckpt, name, shard, lo, hi, box_off, box_len, item, flat) -> int:
    """Copy shard ∩ box into ``flat`` (the box's bytes), one run along the last dimension at a time."""
    path = ckpt / shard["file"]
    src_strides, dst_strides = _strides(shard["lengths"]), _strides(box_len)
    run = (hi[-1] - lo[-1]) if lo else 1
    verified: set[int] = set()
    if not path.is_file():
        raise ResumeError(f"{name!r}: its shard file {str(path)!r} is missing.")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        count = 0
        for lead in itertools.product(*[range(a, b) for a, b in zip(lo[:-1], hi[:-1], strict=True)]):
            idx = [*lead, lo[-1]] if lo else []
            src = sum((i - o) * st for i, o, st in zip(idx, shard["offsets"], src_strides, strict=True))
            dst = sum((i - o) * st for i, o, st in zip(idx, box_off, dst_strides, strict=True))
            start, nbytes = shard["byte_offset"] + src * item, run * item
            if start + nbytes > size:
                raise ResumeError(f"{name!r}: {str(path)!r} is truncated ({size} bytes; the shard needs "
                                  f"{shard['byte_offset'] + math.prod(shard['lengths']) * item}).")
            _verify_blocks(f, path, name, shard, src * item, nbytes, item, verified)
            f.seek(start)
            flat[dst * item: dst * item + nbytes] = numpy.frombuffer(f.read(nbytes), dtype=numpy.uint8)
            count += run
    return count


def _verify_blocks(f, path, name, shard, rel_start, nbytes, item, verified) -> None:
    total = math.prod(shard["lengths"]) * item
    for b in range(rel_start // BLOCK, (rel_start + nbytes - 1) // BLOCK + 1 if nbytes else 0):
        if b in verified:
            continue
        f.seek(shard["byte_offset"] + b * BLOCK)
        data = f.read(min(BLOCK, total - b * BLOCK))
        if zlib.crc32(data) != shard["block_crc32"][b]:
            raise ResumeError(f"{name!r}: {str(path)!r} is corrupted (block {b} of its shard at "
                              f"{shard['offsets']} fails its checksum).")
        verified.add(b)
