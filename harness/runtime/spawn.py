"""How the World's rank processes come to be: a fork server that imported torch once, a free port, and the line
a dead process's exit code reads as."""

from __future__ import annotations

import os
import signal
import socket
from multiprocessing import get_context

from harness.runtime.rank import _RANK_ENV


def _death(code: int | None) -> str:
    """'died with exit code 3' / 'was killed by signal SIGKILL'."""
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"died with exit code {code}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PRELOAD = ("torch", "torch.distributed", "harness.runtime.rank",
           "torch.distributed.fsdp", "torch.distributed.tensor.parallel", "torch.distributed.pipelining")
"""What the fork server imports before it forks a rank: torch, and the distributed modules nearly every suite's
ranks import (FSDP2 brings in ``torch._dynamo``): 0.5 s of each rank's start on 2 cores, ~2 s of a World of 4
(``suites/harness/test_world.py`` holds that they are there). None of them touches CUDA when imported."""


def _context():
    """Rank processes come from a fork server that imported torch once (importing torch costs 1-3 s per
    process; a World of 3 ranks respawned after a failure would pay it 3 times). The server imports
    ``PRELOAD`` but initialises no CUDA and runs no op, so its forks start clean; its children are spawned as
    fresh processes would be in every other respect (their own default group, their own store)."""
    global _CTX
    if _CTX is None:
        from multiprocessing import forkserver

        from harness.runtime import preload

        ctx = get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD) + (["harness.runtime.preload_server"] if _STACKS else []))
        # The server's environment is every rank's: one thread per CPU rank, read by the BLAS libraries
        # when torch loads them in the server, not later; and the stacks it preloads.
        env = {**_RANK_ENV, preload.ENV: ",".join(_STACKS)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update({k: v for k, v in env.items() if saved[k] is None or k == preload.ENV})
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _CTX = ctx
    return _CTX


_CTX = None
_STACKS: list[str] = []


def preload_stacks(names) -> list[str]:
    """Have the fork server import these third-party stacks (``harness.runtime.preload.IMPORTS``: torchtitan,
    megatron) once, before it forks any rank — those the registry says run here, and only on a CPU-only torch: a
    stack's import that touched CUDA in the server would be inherited by every fork, so on a CUDA (or ROCm) build each
    rank imports its stacks itself, as before. Called before the first World of this process starts its server
    (later: no effect). Returns the stacks it will preload."""
    import torch

    from harness.runtime.preload import IMPORTS

    cpu_only = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
    if _CTX is None and cpu_only:
        for name in names:
            if name in IMPORTS and name not in _STACKS and _runs_here(name):
                _STACKS.append(name)
    return list(_STACKS)


def _runs_here(stack: str) -> bool:
    """Whether the registry's stack ``stack`` can run here (``registry.skip_reason``: its packages installed, a release
    its adapter drives)."""
    from harness.records import registry

    return registry.skip_reason(registry.resolve(stack, "stack")) is None
