"""Coverage of every process a test run starts, the World's ranks included (`tox -e coverage`).

A World's ranks are forks of its fork server and leave by ``os._exit`` (harness/runtime/rank.py): a plain
``coverage run`` measures the driver alone. This hook, run at each interpreter's start by a ``.pth`` file in the env's
site-packages (``python .ci/coverage/hook.py --install`` puts both there) where ``COVERAGE_PROCESS_START`` names the rc
file, starts coverage there (``coverage.process_startup``), saves before ``os._exit``, and in each forked rank saves
between calls at most every 3 s: a World killed after a failure (SIGKILL: no exit handler runs) loses only its last
seconds. Nothing happens where the variable is unset: the env's other processes (pip) are untouched."""

from __future__ import annotations

import contextlib
import os
import sys
import time

SAVE_EVERY_S = 3.0


def _save() -> None:
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        with contextlib.suppress(Exception):  # measuring never fails the run it measures
            current.save()


def _save_between_calls() -> None:
    """In a forked child: a World rank's call loop puts torch back after every call
    (``harness.runtime.hygiene.restore``, between calls, nothing else running); there, at most every
    ``SAVE_EVERY_S``, its data is saved. (A thread saving on a timer raced the tracer of the computing main thread: a
    rank died of SIGSEGV inside ``Coverage.save``.)"""
    try:
        from harness.runtime import hygiene
    except ImportError:
        return
    restore, last = hygiene.restore, [float("-inf")]  # the first call's end saves: a World killed young keeps its start

    def restored_then_saved(*args, **kwargs):
        out = restore(*args, **kwargs)
        if time.monotonic() - last[0] >= SAVE_EVERY_S:
            _save()
            last[0] = time.monotonic()
        return out

    hygiene.restore = restored_then_saved


def start() -> None:
    """In a process whose environment names an rc file: measure it, and its forks, to their end."""
    if not os.environ.get("COVERAGE_PROCESS_START"):
        return
    import coverage

    coverage.process_startup()
    leave = os._exit

    def saved_then_exit(code):
        _save()
        leave(code)

    os._exit = saved_then_exit
    os.register_at_fork(after_in_child=_save_between_calls)


def install() -> str:
    """Copy this module into this interpreter's site-packages beside a ``.pth`` that runs its ``start`` at each
    interpreter's start; returns the ``.pth``'s path."""
    import shutil
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    shutil.copyfile(os.path.abspath(__file__), os.path.join(site, "zz_paritybench_coverage.py"))
    path = os.path.join(site, "zz_paritybench_coverage.pth")
    with open(path, "w") as f:
        f.write("import zz_paritybench_coverage; zz_paritybench_coverage.start()\n")
    return path


if __name__ == "__main__" and sys.argv[1:] == ["--install"]:
    print("coverage hook:", install())
