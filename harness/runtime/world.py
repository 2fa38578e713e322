"""The World: ``size`` rank processes kept alive, one call runs a function on all of them.

    with World(4) as world:
        per_rank = world.run(fn, *args, timeout=30)   # list indexed by rank

Each rank is a process (forked from a server that imported torch once, see ``harness.runtime.spawn``) with an
initialised ``torch.distributed`` default group (gloo on CPU, nccl with one GPU per rank on CUDA),
rendezvous through a FileStore in a private temporary folder, so nothing listens on the network. The
parent enforces every call's deadline itself:

- a rank that raises        -> ``RankFailure`` with each failing rank's traceback;
- a rank that dies           -> ``RankFailure`` at once (its process sentinel fires), with its exit code;
- a call past its deadline   -> ``WorldTimeout`` with the Python stack (faulthandler) of every rank
                                that never returned;
- a call no rank progresses in -> ``WorldHang`` (a ``WorldTimeout``) as soon as every rank still inside
                                it has used no CPU for ``harness.runtime.hang``'s window (10 s), named in one
                                line: the collective the waiting ranks are in and where the missing rank is.

After a failure that leaves ranks stuck or dead, the ranks are killed and the next ``run`` spawns a
fresh world; the World object stays usable either way. Under torchrun the same calls go to the
job's ranks instead (``harness.runtime.spmd``): rank 0 drives, the others follow.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
import time
from multiprocessing import connection

from harness.runtime import hang
from harness.runtime import spmd_runtime as spmd
from harness.runtime.failures import (
    ImplementationFailure,
    RankFailure,
    WorldHang,
    WorldTimeout,
    _first_errors,
    verdict_of,
)
from harness.runtime.rank import _rank_main, default_backend, rank_device
from harness.runtime.spawn import _context, _death, _free_port

__all__ = ["World", "RankFailure", "ImplementationFailure", "WorldTimeout", "WorldHang", "rank_device",
           "default_backend", "verdict_of", "run_or_fail"]

# A rank that raised (or failed in the code under test, harness.runtime.rank.failed_in_implementation) leaves its
# peers blocked in a collective; they get this long to finish anyway — or less: the grace ends once none of them
# has used the CPU for _GRACE_IDLE_S (blocked in a collective the failed rank never joins; sampled every
# _GRACE_PROBE_S). A peer still computing keeps the whole grace.
_PEER_GRACE_S = 3.0
_GRACE_IDLE_S = 1.0
_GRACE_PROBE_S = 0.25
_PROBE_S = 1.0  # how often a waiting parent samples its ranks' CPU time (harness.runtime.hang)


class World:
    """``size`` long-lived rank processes; ``run(fn, ...)`` calls module-level ``fn`` on each rank.

    Args:
        size: number of ranks (>= 1).
        backend: "gloo", "nccl", or None for ``default_backend(size)``.
        timeout: default deadline in seconds for ``run`` and for spawning.
        hang_window: seconds with no rank progressing after which a call is hung (``harness.runtime.hang``);
            None reads ``PARITYBENCH_HANG_WINDOW_S`` (default 10), 0 turns detection off.
    """

    def __init__(self, size: int, backend: str | None = None, timeout: float = 60.0,
                 hang_window: float | None = None):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"World size must be a whole number >= 1, got {size!r}.")
        if backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo', 'nccl' or None (automatic), got {backend!r}.")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}.")
        self._spmd = spmd.active()
        if self._spmd and size != spmd.world_size():
            raise ValueError(f"under torchrun a World has exactly the job's {spmd.world_size()} ranks; "
                             f"got size {size} (pass --world-sizes {spmd.world_size()}).")
        if backend == "nccl" and not self._spmd:
            import torch

            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if visible < size:  # each rank takes its own device: said here, not as every rank dying at start-up
                raise ValueError(f"a World of {size} rank(s) on nccl needs a CUDA device per rank; {visible} visible "
                                 "here — use backend 'gloo' (or None: nccl where there are enough, else gloo).")
        self.size = size
        self.backend = spmd.backend() if self._spmd else (backend or default_backend(size))
        self.timeout = float(timeout)
        self.hang_window = hang.window_s() if hang_window is None else float(hang_window)
        self._procs: list | None = None
        self._conns: list = []
        self._where: list = []
        self._tmpdir: str | None = None
        self._call_id = 0
        self.spawn_count = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self._procs else "idle"
        return f"World(size={self.size}, backend={self.backend!r}, {state})"

    @property
    def alive(self) -> bool:
        return self._procs is not None

    def _spawn(self) -> None:
        ctx = _context()
        self._tmpdir = tempfile.mkdtemp(prefix="paritybench-world-")
        store_path = os.path.join(self._tmpdir, "store")
        self._procs, self._conns, self._where = [], [], []
        collective_timeout = max(1800.0, self.timeout)
        port = _free_port()  # the launcher environment's MASTER_PORT (harness.runtime.rank.launcher_env)
        for rank in range(self.size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            where_parent, where_child = ctx.Pipe(duplex=True)  # "where are you?", answered by a thread
            stack_path = self._stack_path(rank)
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, self.size, self.backend, store_path, stack_path, child_end,
                      collective_timeout, where_child, port),
                name=f"paritybench-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            where_child.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._where.append(where_parent)
        self.spawn_count += 1
        try:
            self._collect(call_id=0, deadline=time.monotonic() + self.timeout, what="start-up")
        except RankFailure:
            self._kill()
            raise

    def _stack_path(self, rank: int) -> str:
        return os.path.join(self._tmpdir, f"rank{rank}.stack")

    def close(self) -> None:
        """Stop the ranks (politely, then by force) and remove the rendezvous folder."""
        if self._procs is None:
            return
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank's pipe
                conn.send_bytes(b"")
        for proc in self._procs:
            proc.join(timeout=5)
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs or []:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs or []:
            proc.join(timeout=10)
        for conn in self._conns + self._where:
            conn.close()
        self._procs, self._conns, self._where = None, [], []
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # --- calls ---------------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank; return the per-rank results, indexed by rank.

        ``fn`` must be importable by name (a module-level function): it is pickled by reference.
        Raises ``RankFailure`` if any rank raises or dies, ``WorldTimeout`` past the deadline
        (``timeout`` seconds, default the World's).
        """
        self._call_id += 1
        try:
            payload = pickle.dumps((self._call_id, fn, args, kwargs))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(
                f"World.run needs a module-level function and picklable arguments; {fn!r} is not: {exc}"
            ) from exc
        if self._spmd:
            return self._run_spmd(fn, args, kwargs)
        if self._procs is None:
            self._spawn()
        deadline = time.monotonic() + (self.timeout if timeout is None else float(timeout))
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank: its sentinel reports it, with the exit code
                conn.send_bytes(payload)
        return self._collect(self._call_id, deadline, what=getattr(fn, "__qualname__", repr(fn)))

    def _run_spmd(self, fn, args, kwargs) -> list:
        results = spmd.call_all(fn, args, kwargs)
        errors = {r: value for r, (status, value) in enumerate(results) if status != "ok"}
        if errors:
            raise RankFailure(f"{_first_errors(errors)} (rank(s) {sorted(errors)} of {self.size} raised during "
                              f"{getattr(fn, '__qualname__', fn)} under torchrun).", errors)
        return [value for _, value in results]

    def _collect(self, call_id: int, deadline: float, what: str) -> list:
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        verdicts: dict[int, str] = {}
        dead: dict[int, str] = {}
        pending = set(range(self.size))
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        pids = {r: p.pid for r, p in enumerate(self._procs)}
        progress = hang.Progress(pids, self.hang_window)
        grace = hang.Progress(pids, _GRACE_IDLE_S, every=_GRACE_PROBE_S)  # sampled once a rank has failed
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waitables = [self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending]
            failed = bool(errors or verdicts)
            ready = connection.wait(waitables, timeout=min(remaining, _GRACE_PROBE_S if failed else _PROBE_S))
            if not ready:  # nothing came back: has any rank progressed within the window (the grace's, once failed)?
                if (grace if failed else progress).stalled(pending) and not any(self._conns[r].poll() for r in pending):
                    if failed:
                        break  # the peers are blocked on the failed rank: the grace ends now
                    return self._fail(what, pending, errors, dead, hung=True)
                continue
            progress.reset()  # an answer is progress: the window starts again
            grace.reset()
            for obj in ready:
                rank = by_sentinel[obj] if isinstance(obj, int) else by_conn[id(obj)]
                while rank in pending and self._conns[rank].poll():
                    try:
                        status, got_id, value = self._conns[rank].recv()
                    except (EOFError, OSError):
                        break  # the pipe closed: the process is gone
                    if got_id != call_id:
                        continue  # stale answer to a call that already failed
                    pending.discard(rank)
                    if isinstance(status, tuple):  # ("failed", detail): a verdict from the code under test's failure
                        verdicts[rank] = status[1]
                    (results if status in ("ok", "ready") or rank in verdicts else errors)[rank] = value
                if rank in pending and not self._procs[rank].is_alive():
                    self._procs[rank].join(timeout=1)  # reap it, so the exit code is known
                    dead[rank] = f"rank {rank} {_death(self._procs[rank].exitcode)} during {what}"
                    crash = hang.crash_stack(self, rank)  # a fatal signal's: where it was, the whole dump kept
                    if crash:
                        frame = hang.innermost_frame(crash)
                        dead[rank] += (f" (in {frame})" if frame else " (in code with no Python frame of its own)") \
                            + f"\n{crash}"  # the line, then the dump: RankFailure.failures keeps it whole
                    pending.discard(rank)
            if dead:
                break  # a dead rank breaks the group; the others cannot finish
            if (errors or verdicts) and not failed:  # the first failure: the grace starts
                deadline = min(deadline, time.monotonic() + _PEER_GRACE_S)
        if not pending and not errors and not dead:
            return [results[r] for r in range(self.size)]
        return self._fail(what, pending, errors, dead, verdicts, results)

    def _fail(self, what: str, pending: set[int], errors: dict, dead: dict, verdicts: dict | None = None,
              results: dict | None = None, hung: bool = False):
        states = self._ask_where(sorted(pending)) if hung else {}
        stuck = {} if dead else hang.rank_stacks(self, sorted(pending))
        # Any failure leaves the group untrustworthy, even when every other rank returned: a rank may
        # return with a collective still in flight (DTensor's functional collectives are asynchronous)
        # whose bytes would then land in the next call's collective. The next call spawns a fresh world.
        self._kill()
        if dead:
            lines = "; ".join(dead[r].partition("\n")[0] for r in sorted(dead))  # a crash's dump is in failures
            raise RankFailure(f"{lines} ({len(dead)} rank(s) {sorted(dead)} of {self.size} died; the world will be "
                              "respawned on the next call).", {**errors, **dead})
        if errors:
            note = f"; ranks {sorted(stuck)} were stuck waiting for them" if stuck else ""
            raise RankFailure(f"{_first_errors(errors)} (rank(s) {sorted(errors)} of {self.size} raised during "
                              f"{what}{note}; the world will be respawned on the next call).", errors, stuck)
        if verdicts:
            first = min(verdicts)
            line = verdicts[first]
            line = line if line.startswith(f"rank {first}:") else f"rank {first}: {line}"
            raise ImplementationFailure(
                f"{line} (ranks {sorted(stuck)} of {self.size} were still inside the "
                f"code under test, blocked or {_PEER_GRACE_S:g} s later, and were ended; the world will be respawned "
                "on the next call).", verdicts, stuck, results or {})
        if hung:
            line = hang.describe(self.size, pending, states, stuck, what)
            raise WorldHang(f"{line} (no rank progressed in {what} for {self.hang_window:g} s: a deadlock; "
                            "the world was restarted).", stuck)
        raise WorldTimeout(
            f"rank(s) {sorted(stuck)} of {self.size} did not return from {what} within the deadline; "
            "the world was restarted.", stuck)

    def _ask_where(self, ranks: list[int]) -> dict[int, dict]:
        """Each rank's ``collective_trace.snapshot()``, asked of its answering thread ({} where none came)."""
        states: dict[int, dict] = {}
        for rank in ranks:
            conn = self._where[rank]
            with contextlib.suppress(OSError, EOFError):
                while conn.poll():  # a late answer to an earlier question
                    conn.recv()
                conn.send_bytes(b"?")
                if conn.poll(hang.STACK_WAIT_S):
                    states[rank] = conn.recv()
        return states

def run_or_fail(world: World, fn, *args, failed, timeout: float | None = None, told=None, **kwargs) -> list:
    """``world.run(fn, *args, **kwargs)``; where a rank raised, died, hung, or failed in the code under test
    while its peers were stuck inside it, every rank's result is ``failed(verdict_of(exc))`` — the suite then
    records its ``fail`` row like any other verdict, naming the failing rank's own failure. ``told``: called with
    the whole failure first (each rank's traceback or stack; ``harness.runtime.bench_case`` logs it)."""
    try:
        return world.run(fn, *args, timeout=timeout, **kwargs)
    except RankFailure as exc:
        if told is not None:
            told(str(exc))
        return [failed(verdict_of(exc))] * world.size
