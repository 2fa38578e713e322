"""Parent side of hang diagnosis: a call whose ranks stopped making progress is a deadlock, named at once.

A World call is **hung** when every rank still inside it used less than ``IDLE_SHARE`` of a core for the
last ``window`` seconds (its process and every live descendant, read from ``/proc``): blocked in a
collective its peers never enter, or blocked outside any. A rank that computes — however long — keeps its
CPU time rising and is never called hung; a gloo rank waiting in a collective sleeps in the kernel (its
transport's loop wakes every 10 ms: 0.15 % of a core). Under nccl a waiting rank may spin on the GPU
stream, so there the deadline still governs. Where ``/proc`` is missing nothing is called hung.

The verdict is one line: each waiting group's collective (op, group, its number on that group, from
``harness.runtime.collective_trace``) and, for each rank of that group not in it, what it does instead and its
innermost frame of the code under test (from its faulthandler stack): "rank 2 never entered all_reduce
#17 on the world group that ranks 0, 1 wait in; rank 2 is in hang_on at ranks.py:34".
"""

from __future__ import annotations

import os
import re
import signal
import time

IDLE_SHARE = 0.02  # of one core; a rank computing on 2 cores shared by 8 ranks still gets >= 10 %
DEFAULT_WINDOW_S = 10.0


def window_s() -> float:
    """The no-progress window: ``PARITYBENCH_HANG_WINDOW_S`` (0 turns detection off), default 10 s."""
    raw = os.environ.get("PARITYBENCH_HANG_WINDOW_S", "")
    try:
        return float(raw) if raw else DEFAULT_WINDOW_S
    except ValueError:
        from harness.errors import UsageError  # the CLI's one sentence and exit code 2

        raise UsageError(f"PARITYBENCH_HANG_WINDOW_S must be seconds (0 turns hang detection off), "
                         f"got {raw!r}.") from None


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds of process ``pid``, of the children it has waited for, and of its live descendants; None where /proc
    cannot tell."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime (fields 14, 15) and cutime, cstime (16, 17): the CPU of children it waited for — a
            # compile's many short compiler processes (inductor's g++), gone before any sample sees them live
            total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, IndexError, ValueError):
            if p == pid:
                return None
    return total


class Progress:
    """CPU samples of the ranks still inside a call; ``stalled(pending)`` is True once none of them
    progressed over the last ``window`` seconds."""

    def __init__(self, pids: dict[int, int], window: float, every: float = 1.0):
        self.pids, self.window, self.every = pids, window, every
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.next = time.monotonic() + every  # a call that returns within a second is never sampled

    def reset(self) -> None:
        """A rank answered: that is progress, so the window starts again from the next sample."""
        self.samples.clear()
        self.next = time.monotonic() + self.every

    def stalled(self, pending) -> bool:
        now = time.monotonic()
        if self.window <= 0 or now < self.next:
            return False
        self.next = now + self.every
        cpu = {r: cpu_seconds(self.pids[r]) for r in pending}
        if any(v is None for v in cpu.values()):
            return False
        self.samples.append((now, cpu))
        old = [(t, c) for t, c in self.samples if t <= now - self.window]
        if not old:
            return False
        self.samples = self.samples[len(old) - 1:]  # the newest sample a window old, and after it
        then, before = old[-1]
        return all(cpu[r] - before.get(r, cpu[r]) < IDLE_SHARE * (now - then) for r in pending)


def _group_name(ranks) -> str:
    return "the world group" if ranks is None else f"group {list(ranks)}"


def _and(ranks) -> str:
    ranks = sorted(ranks)
    return ", ".join(map(str, ranks[:-1])) + (" and " if len(ranks) > 1 else "") + str(ranks[-1])


_OURS = tuple(os.path.join("harness", "runtime", f) for f in ("collective_trace.py", "rank.py"))  # the rank's loop
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def innermost_frame(stack: str) -> str | None:
    """'hang_on at ranks.py:34' — the innermost frame of a faulthandler dump's main thread (the thread that
    runs the call) that is neither torch's, nor the standard library's, nor the rank's own loop or wrapper."""
    import sysconfig

    import torch

    skipped = (os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"])
    blocks = re.split(r"^(?=(?:Current thread|Thread) 0x)", stack, flags=re.M)
    main = next((b for b in blocks if "in _rank_main" in b), stack)
    for line in main.splitlines():
        m = _FRAME.match(line)
        if not m or m["file"].endswith(_OURS):
            continue
        # torch's frames and the standard library's (a multiprocessing wait) are not the code under test
        if any(m["file"].startswith(d) for d in skipped) and "site-packages" not in m["file"].replace(skipped[0], ""):
            continue
        return f"{m['fn']} at {os.path.basename(m['file'])}:{m['line']}"
    return None


def where(rank: int, state: dict, stack: str) -> str:
    """'rank 2 is in hang_on at ranks.py:34' ('... in code with no Python frame of its own' where the stack
    has none of the code under test), with the last asynchronous collectives issued when it is in none."""
    frame = innermost_frame(stack)
    issued = [f"{op} #{n} on {_group_name(g)}" for g, (op, n) in (state.get("issued") or {}).items()]
    tail = f" (last asynchronous collective issued: {', '.join(issued)})" if issued and not state.get("inside") else ""
    return f"rank {rank} is in {frame or 'code with no Python frame of its own'}{tail}"


def describe(size: int, pending, states: dict, stacks: dict, what: str) -> str:
    """The hang's one line (see the module's docstring). ``states`` maps each pending rank to its
    ``collective_trace.snapshot()`` (or ``{}`` where it did not answer)."""
    waits: dict[tuple, list[int]] = {}
    inside: dict[int, tuple] = {}
    for r in sorted(pending):
        for op, group, n, _ in (states.get(r) or {}).get("inside", []):
            waits.setdefault((op, group, n), []).append(r)
            inside.setdefault(r, (op, group, n))
    parts, crossed = [], set()
    for (op, group, n), waiting in sorted(waits.items(), key=lambda kv: kv[1]):
        call = f"{op} #{n} on {_group_name(group)}"
        who = f"ranks {_and(waiting)} wait" if len(waiting) > 1 else f"rank {waiting[0]} waits"
        members = range(size) if group is None else group
        for m in (m for m in members if m not in waiting):
            if m not in pending:
                parts.append(f"rank {m} returned from {what} without entering {call} that {who} in")
                continue
            here = where(m, states.get(m) or {}, stacks.get(m, ""))
            if m not in inside:
                parts.append(f"rank {m} never entered {call} that {who} in; {here}")
            elif frozenset({(op, group, n), inside[m]}) not in crossed:  # once, not again from the other side
                crossed.add(frozenset({(op, group, n), inside[m]}))
                o2, g2, n2 = inside[m]
                parts.append(f"rank {m} waits in {o2} #{n2} on {_group_name(g2)} while {who} in {call}; {here}")
    if not parts:  # nobody in a traced collective, or all of a group inside it: say where each rank is
        parts = [(f"rank {r} waits in {inside[r][0]} #{inside[r][2]} on {_group_name(inside[r][1])}" if r in inside
                  else where(r, states.get(r) or {}, stacks.get(r, ""))) for r in sorted(pending)]
    return "; ".join(dict.fromkeys(parts))


def crash_stack(world, rank: int) -> str | None:
    """The Python stacks a rank's faulthandler wrote when a fatal signal killed it ("Fatal Python error: Segmentation
    fault" and every thread's frames), or None (it died otherwise, or wrote nothing)."""
    path = world._stack_path(rank) if world._tmpdir is not None else None
    if path is None or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    start = text.rfind("Fatal Python error")
    return text[start:] if start >= 0 else None


STACK_WAIT_S = 1.0
"""How long a rank has to answer (its stack after SIGUSR1, its collectives' state)."""

def rank_stacks(world, ranks: list[int]) -> dict[int, str]:
    """Ask each rank for its Python stack (faulthandler on SIGUSR1) and read what it wrote."""
    if not ranks or world._tmpdir is None:
        return {}
    sizes = {}
    for rank in ranks:
        path = world._stack_path(rank)
        sizes[rank] = os.path.getsize(path) if os.path.exists(path) else 0
        if world._procs[rank].is_alive():
            os.kill(world._procs[rank].pid, signal.SIGUSR1)
    stacks: dict[int, str] = {}
    partial: dict[int, str] = {}
    end = time.monotonic() + STACK_WAIT_S
    while len(stacks) < len(ranks) and time.monotonic() < end:
        time.sleep(0.02)
        for rank in ranks:
            path = world._stack_path(rank)
            if rank not in stacks and os.path.exists(path) and os.path.getsize(path) > sizes[rank]:
                with open(path) as f:
                    f.seek(sizes[rank])
                    text = f.read()
                # faulthandler writes the newest thread first and the main thread (the rank's loop) last: a dump
                # read before that block is written names no frame of the rank's call — wait for it
                (stacks if "in _rank_main" in text else partial)[rank] = text
    for rank in ranks:
        stacks.setdefault(rank, partial.get(rank) or "(no stack: the rank did not answer SIGUSR1)")
    return stacks
