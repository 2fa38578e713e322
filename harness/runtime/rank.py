"""The rank side of a World: each spawned process's main loop, and what a rank asks about itself."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback

# Threads per CPU rank: 2 cores run up to 8 ranks, so any intra-op parallelism only oversubscribes.
_RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def default_backend(size: int) -> str:
    """nccl when there is one CUDA device per rank, gloo otherwise."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= size:
        return "nccl"
    return "gloo"


def rank_device():
    """The device this rank's tensors live on: ``cuda:<local rank>`` under nccl, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def summed(values, group=None) -> list[float]:
    """``values`` (numbers) summed over the ranks of ``group`` (the world where None), in float64, made on this rank's
    device (``rank_device``: nccl's groups have no CPU backend). Collective: every rank of ``group`` calls it with as
    many values. The stacks' step loss is read this way."""
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(v) for v in values], dtype=torch.float64, device=rank_device())
    dist.all_reduce(total, group=group)
    return total.tolist()


_VERDICT: list[str] = []
"""This call's failure of the code under test, as ``failed_in_implementation`` recorded it (rank side)."""


def failed_in_implementation(detail: str) -> str:
    """Rank side, where a case catches the code under test's own exception (or any failure that may leave
    its peers blocked inside it): the case has its verdict. The rank still returns its result; the World
    then gives peers that have not returned a short grace and ends them rather than waiting out the
    deadline (``harness.runtime.world.ImplementationFailure`` names this rank's ``detail``). Returns ``detail``."""
    _VERDICT.append(detail)
    return detail


def computed_once(cache: dict, key, compute):
    """``compute()`` run by rank 0 of the default group and broadcast (picklable, CPU tensors), cached per
    process under ``key`` — an oracle every rank needs, trained once per World instead of once per rank.
    Collective: every rank of the World makes the same calls, so all broadcast or none."""
    import torch.distributed as dist

    if key not in cache:
        box = [compute() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        cache[key] = box[0]
    return cache[key]


def launcher_env(rank: int, size: int, port: int) -> dict[str, str]:
    """What torchrun gives each process (one node): a library that reads its rank from the environment
    (accelerate's ``PartialState``, DeepSpeed's ``init_distributed``) sees the World. ``MASTER_PORT``: a port
    free when the World started; nobody listens there — the default group is already initialised (through a
    FileStore), which such a library checks (``torch.distributed.is_initialized()``) before making its own."""
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size),
            "GROUP_RANK": "0", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _rank_main(rank: int, size: int, backend: str, store_path: str, stack_path: str, conn, timeout_s,
               where=None, port: int = 29500):
    """Body of a rank process: initialise the default group, then serve calls until told to stop."""
    import faulthandler

    for key, value in _RANK_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.update(launcher_env(rank, size, port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks of a World share one machine
    stack_file = open(stack_path, "w")  # noqa: SIM115 - must outlive this frame for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)  # a fatal signal (SIGSEGV ...): where, for its death line

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from harness.runtime import collective_trace
    from harness.runtime.gloo_device import share

    torch.set_num_threads(1)
    collective_trace.install()  # which collective this rank is in, for a hang's verdict (harness.runtime.hang)
    if where is not None:
        collective_trace.serve(where)
    share()  # one gloo device for all of this rank's groups: an idle group's device thread costs CPU
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.FileStore(store_path, size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s)
    )
    from harness.runtime import hygiene

    pristine = hygiene.snapshot()  # torch's own, before any call's third party
    conn.send(("ready", 0, None))
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if not data:
            break
        call_id = -1
        try:
            call_id, fn, args, kwargs = pickle.loads(data)
            _VERDICT.clear()
            result = fn(*args, **kwargs)
            status = ("failed", _VERDICT[0]) if _VERDICT else "ok"
            conn.send_bytes(pickle.dumps((status, call_id, result)))
        except BaseException:  # noqa: BLE001 - everything a rank raises goes back to the parent
            conn.send(("err", call_id, traceback.format_exc()))
        finally:  # what the call patched process-wide does not reach the next call (harness.runtime.hygiene)
            hygiene.restore(pristine)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown (about 0.75 s with torch loaded, per rank, at every close
    # and respawn): nothing is left to flush but the standard streams — and multiprocessing's finalizers.
    run_multiprocessing_finalizers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_multiprocessing_finalizers() -> bool:
    """Run what multiprocessing runs at a normal exit (``util._run_finalizers(0)``: a named semaphore a rank made —
    tqdm's lock in torch's FX interpreter, under ``torch.compile`` — unlinked and unregistered), which ``os._exit``
    skips: else the parent's resource tracker warns of "leaked semaphore objects" at its own exit, and unlinks them
    then. Private to multiprocessing: where it is missing, nothing is run (the tracker's own clean-up, its warning);
    returns whether it ran."""
    import multiprocessing.util

    finalize = getattr(multiprocessing.util, "_run_finalizers", None)
    if not callable(finalize):
        return False
    try:
        finalize(0)
    except Exception:  # noqa: BLE001 - a finalizer's failure must not keep the rank from leaving
        return False
    return True


