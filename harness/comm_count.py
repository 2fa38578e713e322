"""Counting the bytes a rank sends through torch.distributed's collectives, for benchmarks that hold
measured communication against ``cost_model``."""

from __future__ import annotations

import contextlib

from reference.cost_model import collective_bytes


@contextlib.contextmanager
def counted_collectives(counter: list):
    """Within the block, every all_reduce / all_gather_into_tensor / reduce_scatter_tensor through
    torch.distributed (and the reference tensor-parallel mappings' aliases of the latter two) adds the
    bytes this rank sends, as its ring algorithm sends them, to ``counter[0]``. Collectives issued from
    C++ (DDP's reducer) or as functional collectives (DTensor, FSDP2) are not seen."""
    import torch.distributed as dist

    import reference.tensor_parallel.mappings as mappings

    def wrap(fn, op, size_of):
        def counted(*args, **kwargs):
            group = kwargs.get("group")
            counter[0] += collective_bytes(op, dist.get_world_size(group), size_of(*args, **kwargs))
            return fn(*args, **kwargs)
        return counted

    def nbytes(t):
        return t.numel() * t.element_size()

    def arg(i: int, name: str):
        """Bytes of the i-th positional argument, or of keyword ``name`` (DeepSpeed passes keywords)."""
        return lambda *a, **k: nbytes(a[i] if len(a) > i else k[name])

    patches = [(dist, "all_reduce", "all_reduce", arg(0, "tensor")),
               (dist, "all_gather_into_tensor", "all_gather", arg(0, "output_tensor")),
               (dist, "reduce_scatter_tensor", "reduce_scatter", arg(1, "input")),
               (dist, "all_gather_single", "all_gather", arg(0, "output_tensor")),
               (dist, "reduce_scatter_single", "reduce_scatter", arg(1, "input")),
               (mappings, "_all_gather", "all_gather", arg(0, "output_tensor")),
               (mappings, "_reduce_scatter", "reduce_scatter", arg(1, "input"))]
    patches = [p for p in patches if hasattr(p[0], p[1])]  # the *_single names are torch >= 2.12's
    saved = [(obj, name, getattr(obj, name)) for obj, name, _, _ in patches]
    try:
        for obj, name, op, size_of in patches:
            setattr(obj, name, wrap(getattr(obj, name), op, size_of))
        yield counter
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
