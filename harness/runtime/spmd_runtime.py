"""The SPMD runtime under torchrun (multi-node): rank 0 drives, the other ranks follow.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m harness.runtime.spmd pytest suites/collectives --world-sizes 16
    torchrun --nproc-per-node 4 -m harness.runtime.spmd paritybench bench collectives --world-sizes 4

Every process initialises the default group from torchrun's environment (nccl with one GPU per local
rank where CUDA is available, else gloo) and a gloo control group. Rank 0 runs the command; a
``World(size)`` there (``size`` must be torchrun's world size) broadcasts each call on the control
group, runs it itself, and gathers every rank's result. The other ranks serve calls in ``follow()``
until rank 0 is done. torchrun/SLURM are the launcher: we write none of our own. The entry point that
torchrun runs is ``harness.runtime.spmd``; this module is what ``World`` imports, and imports nothing of the
harness, so that data flows one way (entry point -> CLI / pytest -> World -> runtime).

Under torchrun the parent cannot kill remote ranks, so a call's deadline is the backend's collective
timeout, not the World's; a rank that raises still yields ``RankFailure`` with its traceback.
"""

from __future__ import annotations

import os
import traceback

_STATE: dict = {}


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def active() -> bool:
    """True in the driving process (rank 0) of an initialised torchrun job."""
    return bool(_STATE) and _STATE["rank"] == 0


def world_size() -> int:
    return _STATE["size"]


def backend() -> str:
    return _STATE["backend"]


def init() -> None:
    import torch
    import torch.distributed as dist

    from harness.runtime.gloo_device import share

    share()  # as in a World's ranks: one gloo device for all of this process's groups
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend)
    _STATE.update(rank=dist.get_rank(), size=dist.get_world_size(), backend=backend,
                  control=dist.new_group(backend="gloo"))


def _execute(fn, args, kwargs) -> tuple[str, object]:
    from harness.runtime.rank import _VERDICT

    _VERDICT.clear()  # remote ranks cannot be ended: a verdict from the code under test changes nothing here
    try:
        return "ok", fn(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - every failure goes back to rank 0
        return "err", traceback.format_exc()


def call_all(fn, args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """Rank 0: run ``fn`` on every rank; [(status, value)] indexed by rank."""
    import torch.distributed as dist

    dist.broadcast_object_list([(fn, args, kwargs)], src=0, group=_STATE["control"])
    mine = _execute(fn, args, kwargs)
    gathered = [None] * _STATE["size"]
    dist.gather_object(mine, gathered, dst=0, group=_STATE["control"])
    return gathered


def follow() -> None:
    """Ranks other than 0: serve calls until rank 0 sends the end (None)."""
    import torch.distributed as dist

    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0, group=_STATE["control"])
        if msg[0] is None:
            return
        fn, args, kwargs = msg[0]
        dist.gather_object(_execute(fn, args, kwargs), None, dst=0, group=_STATE["control"])
