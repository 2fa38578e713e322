"""Counting the bytes a rank sends through torch.distributed's collectives, for benchmarks that hold
measured communication against ``cost_model``."""

from __future__ import annotations

import contextlib

from reference.cost_model import collective_bytes


@contextlib.contextmanager
def counted_collectives(counter: list, by_op: dict | None = None):
    """Within the block, every all_reduce / all_gather_into_tensor / reduce_scatter_tensor through
    torch.distributed (and the reference tensor-parallel mappings' aliases of the latter two) adds the
    bytes this rank sends, as its ring algorithm sends them, to ``counter[0]`` — also where a loaded module holds
    one of them under its own name (``_aliases``). Collectives issued from C++ (DDP's reducer) or as functional
    collectives (DTensor, FSDP2) are not seen. ``by_op``: each op's bytes apart too ({"all_reduce": ..., ...})."""
    import torch.distributed as dist

    import reference.tensor_parallel.mappings as mappings

    def wrap(fn, op, size_of):
        def counted(*args, **kwargs):
            group = kwargs.get("group")
            sent = collective_bytes(op, dist.get_world_size(group), size_of(*args, **kwargs))
            counter[0] += sent
            if by_op is not None:
                by_op[op] = by_op.get(op, 0.0) + sent
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
    named = {(id(obj), name) for obj, name, _, _ in patches}  # a module patched by name is not an alias again (the
    # mappings' _all_gather is dist.all_gather_single itself: patched twice, it was counted twice)
    patches += [p for p in _aliases({getattr(obj, name): (op, size_of) for obj, name, op, size_of in patches
                                     if obj is dist}) if (id(p[0]), p[1]) not in named]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _, _ in patches]
    try:
        for obj, name, op, size_of in patches:
            setattr(obj, name, wrap(getattr(obj, name), op, size_of))
        yield counter
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def _aliases(functions: dict) -> list:
    """(module, attribute, op, size_of) of every loaded module's own global bound to one of ``functions`` — a
    third party that took a collective by value at import (megatron-core's ``dist_reduce_scatter_func =
    torch.distributed.reduce_scatter_tensor``) would otherwise send uncounted."""
    import sys

    out = []
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict) or getattr(module, "__name__", "").startswith("torch.distributed"):
            continue
        for name, value in list(names.items()):
            try:
                known = functions.get(value)
            except TypeError:  # an unhashable global
                continue
            if known is not None:
                out.append((module, name, *known))
    return out


_FUNCTIONAL = {  # _c10d_functional op -> (cost-model op, S in bytes from (args, group size))
    "all_reduce": ("all_reduce", lambda a, n: _bytes(a[0])),
    "all_reduce_": ("all_reduce", lambda a, n: _bytes(a[0])),
    "all_reduce_coalesced": ("all_reduce", lambda a, n: sum(_bytes(t) for t in a[0])),
    "all_gather_into_tensor": ("all_gather", lambda a, n: _bytes(a[0]) * n),
    "all_gather_into_tensor_coalesced": ("all_gather", lambda a, n: sum(_bytes(t) for t in a[0]) * n),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, n: _bytes(a[0])),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", lambda a, n: sum(_bytes(t) for t in a[0])),
    "all_to_all_single": ("all_to_all", lambda a, n: _bytes(a[0])),
    "broadcast": ("broadcast", lambda a, n: _bytes(a[0])),
}


def _bytes(t) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def counted_traffic(counter: list):
    """Every byte this rank sends within the block, into ``counter[0]``: ``counted_collectives``' Python
    collectives (FSDP2's all_gather_single / reduce_scatter_single among them), torch's functional
    collectives (DTensor's redistributions: a dispatch mode sees each ``_c10d_functional`` op on its local
    tensor), point-to-point sends (``isend`` / ``send``: the pipeline's activations and gradients, whether
    batched or not) and ``all_to_all_single`` (Ulysses). Collectives from C++ (DDP's reducer) are still not
    seen. The functional collectives are seen through private torch APIs (``functional_mode``); where this torch
    lacks them they run uncounted, as torch runs them, and ``UNCOUNTED`` says why."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def sent(fn):
        def counted(tensor, *args, **kwargs):
            counter[0] += _bytes(tensor)
            return fn(tensor, *args, **kwargs)
        return counted

    def all_to_all(fn):
        def counted(output, input, *args, **kwargs):
            # all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, ...), by keyword or place
            group = kwargs.get("group", args[2] if len(args) > 2 else None)
            splits = kwargs.get("input_split_sizes", args[1] if len(args) > 1 else None)
            splits = [int(s) for s in splits] if splits is not None else []  # a list or numpy (megatron's)
            if splits:  # variable splits: the rows this rank sends to the others (its own stay)
                row = _bytes(input) // max(input.shape[0], 1) if input.dim() else 0
                me = dist.get_rank(group)
                counter[0] += (sum(splits) - splits[me]) * row
            else:  # equal splits, S the whole buffer: (n - 1) / n of it leaves
                counter[0] += collective_bytes("all_to_all", dist.get_world_size(group), _bytes(input))
            return fn(output, input, *args, **kwargs)
        return counted

    # both names of each: P2POp takes torch.distributed's, batch_isend_irecv compares with distributed_c10d's
    saved = [(m, name, getattr(m, name)) for name in ("isend", "send", "all_to_all_single") for m in (dist, c10d)]
    originals = {name: getattr(c10d, name) for name in ("isend", "send")}
    try:
        for name, fn in originals.items():
            wrapper = sent(fn)
            setattr(dist, name, wrapper)
            setattr(c10d, name, wrapper)
        dist.all_to_all_single = all_to_all(c10d.all_to_all_single)
        with counted_collectives(counter), functional_mode(counter):
            yield counter
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


UNCOUNTED: list[str] = []
"""Why this process's functional collectives run uncounted (said once each), where this torch lacks what
``functional_mode`` reads."""


def functional_mode(counter: list):
    """A dispatch mode adding each ``_c10d_functional`` collective's bytes to ``counter[0]`` — through torch's
    private ``torch.utils._python_dispatch.TorchDispatchMode``, an op's ``_overloadpacket`` and
    ``distributed_c10d._resolve_process_group`` (a functional op names its group by name). Where any of them is
    missing, or an op's group cannot be resolved, the op runs as torch runs it, uncounted, and ``UNCOUNTED``
    (and a warning, once) says so: never a crash in the code under test."""
    import torch.distributed.distributed_c10d as c10d

    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError as exc:
        _uncounted(f"this torch has no TorchDispatchMode ({exc})")
        return contextlib.nullcontext()
    resolve = getattr(c10d, "_resolve_process_group", None)

    class Functional(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            packet = getattr(func, "_overloadpacket", None)
            known = _FUNCTIONAL.get(getattr(packet, "__name__", "")) \
                if getattr(func, "namespace", None) == "_c10d_functional" else None
            if known:
                try:
                    size = resolve(args[-1]).size()
                    counter[0] += collective_bytes(known[0], size, known[1](args, size))
                except Exception as exc:  # noqa: BLE001 - counting must never change what the op does
                    _uncounted(f"{packet.__name__}'s group could not be resolved here ({type(exc).__name__}: {exc})")
            return func(*args, **(kwargs or {}))

    return Functional()


def _uncounted(why: str) -> None:
    import warnings

    if why not in UNCOUNTED:
        UNCOUNTED.append(why)
        warnings.warn(f"paritybench: functional collectives are not counted: {why}.", RuntimeWarning, stacklevel=3)
