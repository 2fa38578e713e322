"""harness.runtime.hang's verdict line from the ranks' answers and stacks (the World's own hang tests drive it live)."""

from __future__ import annotations

import os
import sysconfig

import pytest
import torch

from harness.runtime.hang import describe, innermost_frame

STD, TORCH = sysconfig.get_paths()["stdlib"], os.path.dirname(torch.__file__)


def _stack(*frames: str) -> str:
    lines = [f'  File "{path}", line {line} in {fn}' for path, line, fn in (f.split("|") for f in frames)]
    return "\n".join(["Thread 0x1 (most recent call first):", f'  File "{STD}/threading.py", line 327 in wait',
                      "", "Current thread 0x2 (most recent call first):", *lines,
                      '  File "/x/harness/runtime/rank.py", line 100 in _rank_main'])


def test_the_frame_named_is_the_code_under_tests_not_torch_s_nor_the_standard_library_s():
    stack = _stack(f"{STD}/multiprocessing/synchronize.py|268|wait", f"{TORCH}/distributed/c10d.py|5|barrier",
                   "/venv/lib/python3.11/site-packages/megatron/core/writer.py|40|write", "/u/mystack.py|31|step")
    assert innermost_frame(stack) == "write at writer.py:40"
    assert innermost_frame(_stack("/x/harness/runtime/collective_trace.py|80|traced", "/u/mystack.py|31|step")) == \
        "step at mystack.py:31"


def test_a_rank_that_returned_and_a_rank_in_another_collective_are_told_apart():
    states = {0: {"inside": [("all_reduce", None, 5, False)]},
              1: {"inside": [("broadcast", None, 5, False)]}}
    stacks = {1: _stack("/u/mystack.py|12|step")}
    line = describe(3, {0, 1}, states, stacks, "train_stack")
    assert line == ("rank 1 waits in broadcast #5 on the world group while rank 0 waits in all_reduce #5 on the "
                    "world group; rank 1 is in step at mystack.py:12; rank 2 returned from train_stack without "
                    "entering all_reduce #5 on the world group that rank 0 waits in; rank 2 returned from train_stack "
                    "without entering broadcast #5 on the world group that rank 1 waits in"), line


def test_no_rank_in_a_collective_says_where_each_is_and_an_unanswered_rank_still_gets_its_frame():
    stacks = {0: _stack("/u/a.py|3|f"), 1: _stack(f"{TORCH}/nn/modules/module.py|9|forward")}
    line = describe(2, {0, 1}, {0: {"inside": [], "issued": {(0, 1): ("all_reduce", 4)}}}, stacks, "g")
    assert line == ("rank 0 is in f at a.py:3 (last asynchronous collective issued: all_reduce #4 on group [0, 1]); "
                    "rank 1 is in code with no Python frame of its own"), line


def test_a_window_of_no_progress_restarts_when_a_rank_answers(monkeypatch):
    """Found in tox: a rank that returned, then its peers' answers still in their pipes, read as a stall. An
    answer is progress: after ``reset`` a whole window must pass again before a call is hung."""
    from harness.runtime import hang

    clock = [100.0]
    monkeypatch.setattr(hang.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hang, "cpu_seconds", lambda pid: 5.0)  # nobody uses CPU
    progress = hang.Progress({0: 1, 1: 2}, window=3.0)
    seen = []
    for _ in range(5):
        clock[0] += 1.0
        seen.append(progress.stalled({0, 1}))
    assert seen == [False, False, False, True, True]  # samples at 101..105; 104 is a window after 101
    progress.reset()
    seen = []
    for _ in range(5):
        clock[0] += 1.0
        seen.append(progress.stalled({0}))
    assert seen == [False, False, False, True, True]
    monkeypatch.setattr(hang, "cpu_seconds", lambda pid: clock[0])  # a computing rank: a core's worth a second
    seen = []
    for _ in range(5):
        clock[0] += 1.0
        seen.append(progress.stalled({0}))
    assert seen == [False] * 5


def test_a_rank_waiting_on_the_short_processes_it_runs_is_computing():
    """A compile runs many short compiler processes, each gone before a sample sees it live: their CPU, once waited for,
    is the rank's (cutime / cstime) — else a rank building a cold torch.compile looks idle and is called hung. A child
    that burns 0.3 s of CPU (its own process time, whatever the load) adds at least 0.25 s (10 ms ticks)."""
    import os
    import subprocess
    import sys

    from harness.runtime.hang import cpu_seconds

    before = cpu_seconds(os.getpid())
    if before is None:
        pytest.skip("no /proc here: nothing is called hung")
    burn = "import time\nwhile time.process_time() < 0.3:\n    pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds(os.getpid()) - before >= 0.25


def test_a_rank_s_stack_is_read_once_its_main_thread_is_written(tmp_path):
    """faulthandler writes the newest thread first and the main thread (the rank's loop, ``_rank_main``) last: a dump
    read as soon as the file grows can hold the other threads only, and named no frame of the rank's call under load
    (CI: "rank 2 is in code with no Python frame of its own" for a rank in time.sleep). The reader waits for the main
    thread's block; a rank that never writes it gets what it wrote."""
    import threading
    import time
    from types import SimpleNamespace

    from harness.runtime import hang

    paths = {r: tmp_path / f"stack{r}" for r in (0, 1)}
    for path in paths.values():
        path.write_text("")
    asked = threading.Event()  # the reader has taken both files' sizes: the dumps may start (no race with it)

    def alive(rank):
        if rank == 1:
            asked.set()
        return False  # no signal sent: the test writes the dumps itself

    procs = {r: SimpleNamespace(is_alive=lambda r=r: alive(r)) for r in (0, 1)}
    world = SimpleNamespace(_tmpdir=str(tmp_path), _stack_path=lambda r: str(paths[r]), _procs=procs)
    other = 'Thread 0x01 (most recent call first):\n  File "/x/threading.py", line 3 in wait\n\n'
    main = ('Current thread 0x02 (most recent call first):\n  File "/x/ranks.py", line 180 in wait_in_a_subgroup\n'
            '  File "/x/harness/runtime/rank.py", line 112 in _rank_main\n')

    def dump():
        asked.wait(5)
        for path in paths.values():
            path.write_text(other)
        time.sleep(0.3)  # longer than the old reader's 20 ms grace
        paths[0].write_text(other + main)  # rank 1 never writes its main thread

    writer = threading.Thread(target=dump)
    writer.start()
    stacks = hang.rank_stacks(world, [0, 1])
    writer.join()
    assert innermost_frame(stacks[0]) == "wait_in_a_subgroup at ranks.py:180", stacks[0]
    assert stacks[1] == other
