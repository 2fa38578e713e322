"""Rank side of hang diagnosis: which collective each rank is in, counted per group.

``install()`` wraps torch.distributed's collectives (both names of each: ``torch.distributed.X`` and
``torch.distributed.distributed_c10d.X``, which torch's own helpers call) so that every call entered on a
thread records ``(op, group, n)`` — n its sequence number among the collectives entered on that group
since the rank started, counting the outermost call only (``broadcast_object_list`` is one collective, not
three) — until it returns. The wrappers pass arguments and results through untouched; a function whose
signature cannot be read is left as torch's own. An asynchronous call (``async_op=True``, ``isend``,
``batch_isend_irecv``) returns at once; its rank then waits in ``Work.wait``, which the stack shows.

``serve(conn)`` answers the World's question "where are you?" from a daemon thread: it runs while the
main thread is blocked inside a collective (torch releases the GIL there), so a hung rank still answers.
Collectives issued from C++ (DDP's reducer) or as functional collectives (DTensor) are not counted; the
stack still names them. Not installed under ``PARITYBENCH_TRACE_COLLECTIVES=0``.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

# op -> whether every call is asynchronous
_OPS = {name: False for name in (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "scatter",
    "scatter_object_list", "send", "recv", "send_object_list", "recv_object_list")}
_OPS.update(isend=True, irecv=True, batch_isend_irecv=True)

_COUNTS: dict = {}  # group (None: the default group) -> collectives entered on it
_INSIDE: dict = {}  # thread id -> (op, group, n, asynchronous) of the outermost call it is in
_ISSUED: dict = {}  # group -> (op, n) of the last asynchronous call issued on it
_INSTALLED: list = []


def install() -> bool:
    """Wrap the collectives of this process's torch.distributed (idempotent). Returns whether any is."""
    if _INSTALLED or os.environ.get("PARITYBENCH_TRACE_COLLECTIVES", "1") == "0":
        return bool(_INSTALLED)
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for op, always_async in _OPS.items():
        fn = getattr(c10d, op, None)
        if fn is None or getattr(fn, "_paritybench_traced", False):
            continue
        wrapper = _traced(fn, op, always_async)
        if wrapper is None:
            continue
        for module in (dist, c10d):
            if getattr(module, op, None) is fn:
                setattr(module, op, wrapper)
        _INSTALLED.append(op)
    return bool(_INSTALLED)


def _traced(fn, op: str, always_async: bool):
    """``fn`` recording its calls, or None where its signature cannot be read (torch's own is kept)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    group_at = names.index("group") if "group" in names else None
    async_at = names.index("async_op") if "async_op" in names else None

    def group_of(args, kwargs):
        if op == "batch_isend_irecv":
            ops = args[0] if args else kwargs.get("p2p_op_list") or []
            return getattr(ops[0], "group", None) if ops else None
        return kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        thread = threading.get_ident()
        if thread in _INSIDE:  # a collective inside a collective: the outer one is the one named
            return fn(*args, **kwargs)
        group = _key(group_of(args, kwargs))
        n = _COUNTS[group] = _COUNTS.get(group, 0) + 1
        asynchronous = always_async or bool(
            kwargs.get("async_op", args[async_at] if async_at is not None and len(args) > async_at else False))
        _INSIDE[thread] = (op, group, n, asynchronous)
        try:
            return fn(*args, **kwargs)
        finally:
            del _INSIDE[thread]
            if asynchronous:
                _ISSUED[group] = (op, n)

    traced._paritybench_traced = True
    return traced


def _key(group):
    """None for the default group however it is named, else the group object itself."""
    import torch.distributed as dist

    if group is None:
        return None
    try:
        return None if group is dist.GroupMember.WORLD else group
    except AttributeError:  # no default group yet
        return group


def _ranks(group) -> tuple[int, ...] | None:
    """The global ranks of ``group``; None for the default group (or one that is gone)."""
    import torch.distributed as dist

    if group is None:
        return None
    try:
        return tuple(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError, KeyError, AttributeError):
        return None


def snapshot() -> dict:
    """Where this rank is: ``inside`` — (op, group ranks or None for the world, n, asynchronous) of each
    thread's outermost collective —, ``counts`` per group, and the last asynchronous call issued per group."""
    return {"inside": [(op, _ranks(g), n, a) for op, g, n, a in list(_INSIDE.values())],
            "counts": {_ranks(g): n for g, n in list(_COUNTS.items())},
            "issued": {_ranks(g): v for g, v in list(_ISSUED.items())}}


def serve(conn) -> threading.Thread:
    """Answer each message on ``conn`` with ``snapshot()``, from a daemon thread, until the pipe closes."""
    def loop():
        while True:
            try:
                conn.recv_bytes()
                conn.send(snapshot())
            except (EOFError, OSError):
                return
            except Exception as exc:  # noqa: BLE001 - an answer that cannot be made is said, not fatal
                try:
                    conn.send({"error": f"{type(exc).__name__}: {exc}"})
                except (OSError, ValueError):
                    return

    thread = threading.Thread(target=loop, name="paritybench-where", daemon=True)
    thread.start()
    return thread
