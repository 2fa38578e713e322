"""Rank-side functions for the World tests (module-level, so a World can call them). What they send over the World's
own group lies on ``rank_device()`` (``cuda:<rank>`` under nccl, whose default group has no CPU backend; the CPU on
gloo); a helper for a gloo-only behaviour says so."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from harness.runtime.rank import rank_device


def rank_and_sum() -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank())], device=rank_device())
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def raise_on(rank: int) -> None:
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.barrier()  # the others wait in a collective the failing rank never joins


def raise_while_a_peer_computes(rank: int, computer: int, seconds: float) -> int:
    """``rank`` raises; ``computer`` keeps a core busy for ``seconds`` (no collective) and returns its rank; the others
    block in a barrier the failing rank never joins."""
    me = dist.get_rank()
    if me == rank:
        raise ValueError(f"planted failure on rank {rank}")
    if me == computer:
        end = time.process_time() + seconds  # CPU seconds: the peer progresses however the cores are shared
        while time.process_time() < end:
            pass
        return me
    dist.barrier()
    return me


def raise_with_collective_in_flight(rank: int) -> None:
    """The others start an all-reduce of 4 floats and return without waiting for it (as DTensor's
    asynchronous functional collectives do); ``rank`` raises."""
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    dist.all_reduce(torch.ones(4, device=rank_device()), async_op=True)


def hang_on(rank: int) -> None:
    if dist.get_rank() == rank:
        time.sleep(3600)
    dist.barrier()


def exit_on(rank: int, code: int) -> None:
    if dist.get_rank() == rank:
        os._exit(code)
    dist.barrier()


def segfault_on(rank: int) -> None:
    """A native crash, as a C++ extension's: reading address 0."""
    import ctypes

    if dist.get_rank() == rank:
        ctypes.string_at(0)
    dist.barrier()


def pid() -> int:
    return os.getpid()


def threads() -> tuple[int, str]:
    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "")


def unpicklable_result():
    return lambda: None


def verdict_on(rank: int, peers_join: bool = False) -> dict:
    """``rank`` catches the code under test's failure (its verdict) and returns; the others block in a
    barrier it never joins — unless ``peers_join``: then it joins late and everyone returns."""
    from harness.runtime.rank import failed_in_implementation

    if dist.get_rank() == rank:
        detail = failed_in_implementation(f"rank {rank}: raised ValueError: odd length 1")
        if peers_join:
            dist.barrier()
        return {"problems": [detail]}
    dist.barrier()
    return {"problems": []}


def _gloo_device_threads() -> int:
    """This process's gloo TCP device loops (one thread each, named by gloo)."""
    task = f"/proc/{os.getpid()}/task"
    return sum(open(f"{task}/{t}/comm").read().strip() == "gloo_tcp_loop" for t in os.listdir(task))


def groups_on_one_device(k: int) -> dict:
    """Create ``k`` groups of every rank and ``k`` of ranks {0, 1}; all-reduce each rank's (rank + 1) over
    each. Returns the device threads before and after, the sums, and whether a gloo backend torch builds
    itself (as its C++ split does) still passes torch's check against its name."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    before = _gloo_device_threads()
    n, r = dist.get_world_size(), dist.get_rank()
    sums = []
    for ranks in [list(range(n))] * k + [[0, 1]] * (k if n > 1 else 0):
        group = dist.new_group(ranks, backend="gloo")  # gloo under an nccl World too
        if r in ranks:
            t = torch.tensor([float(r + 1)])
            dist.all_reduce(t, group=group)
            sums.append((len(ranks), t.item()))
    after = _gloo_device_threads()
    shared = c10d.ProcessGroupGloo
    base = shared.__mro__[1] if getattr(shared, "_paritybench_shared", False) else shared
    made_by_torch = base(dist.PrefixStore(f"direct{k}", c10d._get_default_store()), r, n, timedelta(seconds=60))
    # every rank's full mesh connected before any drops its group: a rank returning at once destroyed its end of a
    # pair a slower peer was still handshaking ("Gloo connectFullMesh failed ... Connection closed by peer", CI)
    dist.barrier()
    return {"before": before, "after": after, "sums": sums,
            "isinstance": isinstance(made_by_torch, c10d.ProcessGroupGloo)}


def all_to_all_counted(how: str) -> float:
    """The bytes ``comm_count.counted_traffic`` counts for one all_to_all_single of 3 float32 rows per peer
    (rank r sends r + 1 + p rows to rank p), its input splits given ``how``: a list, a numpy array
    (megatron-core's), or by position."""
    import numpy as np

    from harness.runtime.comm_count import counted_traffic

    n, r = dist.get_world_size(), dist.get_rank()
    send = [r + 1 + p for p in range(n)]  # uneven: equal splits would count the same bytes either way
    recv = [p + 1 + r for p in range(n)]
    x, out = torch.ones(sum(send), 3, device=rank_device()), torch.empty(sum(recv), 3, device=rank_device())
    splits = {"list": send, "numpy": np.array(send), "positional": send}[how]
    counter = [0.0]
    with counted_traffic(counter):
        if how == "positional":
            dist.all_to_all_single(out, x, recv, splits)
        else:
            dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=splits)
    return counter[0]


def gloo_fallback_matches_torch(keyword: str) -> dict:
    """Build one group through the shared-device constructor with ``keyword=True`` (a value the shared
    device's options cannot serve: ``enable_reconfigure`` on torch 2.14+, unknown before) and one through
    torch's own constructor, on the same store. Returns each outcome (the group's class and its device
    threads added, or the exception torch raised) and the fallback reasons recorded."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    from harness.runtime import gloo_device

    shared = c10d.ProcessGroupGloo
    base = shared.__mro__[1] if getattr(shared, "_paritybench_shared", False) else shared
    n, r = dist.get_world_size(), dist.get_rank()
    outcomes = []
    for i, cls in enumerate((shared, base)):
        store = dist.PrefixStore(f"fallback-{keyword}-{i}", c10d._get_default_store())
        before = _gloo_device_threads()
        try:
            cls(store, r, n, timedelta(seconds=60), **{keyword: True})
            outcomes.append(("built", _gloo_device_threads() - before))
        except Exception as exc:  # noqa: BLE001 - torch's own refusal is the outcome compared
            outcomes.append((type(exc).__name__, str(exc).splitlines()[0]))
    return {"shared": outcomes[0], "torch": outcomes[1], "fallbacks": list(gloo_device.FALLBACKS)}


def sleep_before_collective(rank: int, collectives: int) -> None:
    """Every rank makes ``collectives`` all-reduces over the world group; ``rank`` then sleeps (a trainer
    that never reaches its next collective) while the others enter one more."""
    for _ in range(collectives):
        dist.all_reduce(torch.ones(1, device=rank_device()))
    if dist.get_rank() == rank:
        time.sleep(3600)
    dist.all_reduce(torch.ones(1, device=rank_device()))


def compute_while_peers_wait(rank: int, seconds: float) -> float:
    """``rank`` computes (CPU-bound matrix products) for ``seconds`` while the others wait for it in a
    broadcast; every rank then returns the broadcast value."""
    t = torch.zeros(1, device=rank_device())
    if dist.get_rank() == rank:
        a, end = torch.rand(64, 64), time.monotonic() + seconds
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
        t += 7.0
    dist.broadcast(t, src=rank)
    return t.item()


def wait_in_a_subgroup(rank: int) -> None:
    """Ranks 0 and 1 form a group and all-reduce on it, except ``rank``, which waits in a world barrier."""
    group = dist.new_group([0, 1])
    if dist.get_rank() == rank:
        dist.barrier()
    elif dist.get_rank() in (0, 1):
        dist.all_reduce(torch.ones(1, device=rank_device()), group=group)
    else:
        time.sleep(3600)


def world_collectives() -> int:
    """How many collectives this rank has entered on the world group (``harness.runtime.collective_trace``)."""
    from harness.runtime import collective_trace

    return collective_trace.snapshot()["counts"].get(None, 0)


def functional_all_reduce_counted(hide_group_resolution: bool) -> dict:
    """A DTensor Partial -> Replicate redistribution (one functional all-reduce of 4 float32) inside
    ``counted_traffic``; with ``hide_group_resolution`` as on a torch without ``_resolve_process_group``."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from harness.runtime import comm_count

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    partial = DTensor.from_local(torch.full((4,), float(dist.get_rank() + 1), device=rank_device()), mesh, [Partial()])
    counter, saved = [0.0], c10d._resolve_process_group
    if hide_group_resolution:
        del c10d._resolve_process_group
    try:
        with comm_count.counted_traffic(counter):
            full = partial.redistribute(mesh, [Replicate()]).to_local()
    finally:
        c10d._resolve_process_group = saved
    return {"bytes": counter[0], "values": full.tolist(), "uncounted": list(comm_count.UNCOUNTED)}


def launcher_env() -> dict:
    """This rank's launcher variables, as a library reading its rank from the environment sees them."""
    import os

    return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT")}


def sequence_gather_counted(_):
    """Bytes counted around the tensor-parallel mappings' sequence all-gather and its backward reduce-scatter of a
    16 x 64 float32 shard, by ``counted_collectives`` and by ``counted_traffic``."""
    import torch
    import torch.distributed as dist

    from harness.runtime.comm_count import counted_collectives, counted_traffic
    from reference.tensor_parallel import mappings

    out = []
    for counting in (counted_collectives, counted_traffic):
        x = torch.ones(16, 64, device=rank_device(), requires_grad=True)
        sent = [0.0]
        with counting(sent):
            mappings.gather_from_sequence_region(x, dist.group.WORLD).sum().backward()
        out.append(sent[0])
    return out


def float8_all_gathered_as_bytes(_):
    """Through ``harness.runtime.gloo_float8``: each rank's float8 shard (all 256 byte patterns, NaN's included,
    rank-shifted) all-gathered; a float32 all-gather through the same wrapped function; and what torch's own function
    says of float8 on this backend."""
    import torch
    import torch.distributed as dist

    from harness.runtime import gloo_float8

    gloo_float8.install()
    gloo_float8.install()  # idempotent: wrapped once
    rank, n = dist.get_rank(), dist.get_world_size()
    codes = [(b + 7 * r) % 256 for r in range(n) for b in range(256)]
    mine = torch.tensor(codes[rank * 256:(rank + 1) * 256], dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = torch.empty(256 * n, dtype=torch.float8_e4m3fn)
    dist.all_gather_into_tensor(out, mine)
    floats = torch.empty(2 * n)
    dist.all_gather_into_tensor(floats, torch.full((2,), float(rank)))
    try:
        gloo_float8.ORIGINAL["all_gather_into_tensor"](out.clone(), mine)
        own = None
    except RuntimeError as exc:
        own = str(exc).splitlines()[0]
    return {"bytes": out.view(torch.uint8).tolist() == codes, "floats": floats.tolist(), "own": own,
            "wrapped_once": dist.all_gather_into_tensor.__wrapped__ is gloo_float8.ORIGINAL["all_gather_into_tensor"]}


def patch_linear() -> bool:
    """Rebind ``torch.nn.functional.linear`` process-wide, as DeepSpeed's ZeRO 3 does."""
    import torch

    found = torch.nn.functional.linear
    torch.nn.functional.linear = lambda x, w, b=None: found(x, w, b)
    return torch.nn.functional.linear is not found


def linear_is_torchs() -> bool:
    import torch

    return torch.nn.functional.linear is torch._C._nn.linear


_FOUND: list = []
"""The patch points as ``patch_every_point`` found them (the rank process outlives its calls)."""


def patch_every_point() -> int:
    """Rebind every known patch point (``harness.runtime.hygiene.PATCH_POINTS``) as ``zero.Init`` does — a class's own
    attribute set where it had none (``nn.Module.__init_subclass__``, ``torch.Tensor.__new__``) —; how many now differ
    from what they were."""
    from harness.runtime import hygiene

    _FOUND[:] = hygiene.snapshot()
    for owner, name, _ in _FOUND:
        found = getattr(owner, name)
        setattr(owner, name, classmethod(lambda cls, **kw: None) if name == "__init_subclass__" else
                staticmethod(found) if name == "__new__" else (lambda *a, _f=found, **k: _f(*a, **k)))
    return sum(now is not was for (_, _, now), (_, _, was) in zip(hygiene.snapshot(), _FOUND, strict=True))


def points_left_patched() -> list:
    """The patch points that differ from what ``patch_every_point`` found ("owner.attribute")."""
    from harness.runtime import hygiene

    return [f"{getattr(owner, '__name__', owner)}.{name}"
            for (owner, name, now), (_, _, was) in zip(hygiene.snapshot(), _FOUND, strict=True) if now is not was]


def not_imported(modules) -> list:
    """Those of ``modules`` this rank has not imported (the fork server's preload, a fresh World's first call: none —
    it imported none of them itself)."""
    import sys

    return [m for m in modules if m not in sys.modules]


_KEPT = []


def keeps_a_named_semaphore() -> str:
    """A multiprocessing lock the rank keeps to its end (as tqdm keeps one, made under ``torch.compile``): its
    named semaphore's file under /dev/shm."""
    import multiprocessing

    lock = multiprocessing.get_context("forkserver").RLock()
    _KEPT.append(lock)
    return "/dev/shm/sem." + lock._semlock.name.lstrip("/")


def summed_here() -> tuple[list[float], list[float]]:
    """``harness.runtime.rank.summed`` of (rank, 1, 0.1) over the world, and of (rank,) over ranks {0, 1}."""
    from harness.runtime.rank import summed

    r = dist.get_rank()
    pair = dist.new_group([0, 1])  # every rank makes it; only its members reduce over it
    return summed([r, 1, 0.1]), (summed([r], pair) if r < 2 else [])
