"""The World: per-rank results, and failures that name the rank, within the deadline, recoverably.

These tests time failure *detection* (a dead rank is reported long before the deadline), never
performance: every bound is a fraction of a deadline set far above any normal latency.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.runtime import spmd_runtime as spmd
from harness.runtime.spawn import PRELOAD
from harness.runtime.world import (
    ImplementationFailure,
    RankFailure,
    World,
    WorldHang,
    WorldTimeout,
    run_or_fail,
    verdict_of,
)
from suites._support.worlds import gloo_only, hang_window

from . import ranks

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(spmd.active(), reason="under torchrun the World cannot kill or respawn ranks")

N = 3  # not a power of two, and small enough to respawn quickly


@pytest.fixture
def world3(world_cache):
    return world_cache.get(N)


def test_run_returns_results_indexed_by_rank(world):
    got = world.run(ranks.rank_and_sum)
    n = world.size
    assert got == [(r, n, n * (n - 1) / 2) for r in range(n)]


def test_what_a_call_patches_in_torch_does_not_reach_the_next_call(world3):
    """A third party's process-wide rebinding (DeepSpeed's ZeRO 3: ``torch.nn.functional.linear``) is put back after
    the call (``harness.runtime.hygiene``): the tests sharing a World do not inherit it. (A call that raises has its
    World respawned anyway.)"""
    assert world3.run(ranks.patch_linear) == [True] * N
    assert world3.run(ranks.linear_is_torchs) == [True] * N


def test_every_point_zero_init_patches_is_put_back_after_the_call(world3):
    """``zero.Init``'s patch points (``harness.runtime.hygiene.PATCH_POINTS``: ``nn.Module.__init_subclass__`` and
    ``apply``, ``torch.Tensor.__new__``, torch's tensor constructors, ``F.embedding``), each rebound by one call, are
    what they were at the next — a class attribute the class did not define removed again."""
    from harness.runtime.hygiene import PATCH_POINTS

    assert world3.run(ranks.patch_every_point) == [len(PATCH_POINTS)] * N
    assert world3.run(ranks.points_left_patched) == [[]] * N


def test_cpu_ranks_use_one_intra_op_thread(world3):
    assert world3.run(ranks.threads) == [(1, "1")] * N


def test_ranks_see_the_environment_a_launcher_gives(world3):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets them on one
    node: each rank its own, the address and port the same on every rank (a library reading them sees the
    World, not one process)."""
    got = world3.run(ranks.launcher_env)
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in got] == \
        [(str(r), str(r), str(N), str(N)) for r in range(N)]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in got} == {("127.0.0.1", got[0]["MASTER_PORT"])}
    assert 0 < int(got[0]["MASTER_PORT"]) < 65536


def test_rank_that_raises_is_named_with_its_traceback(world3):
    with pytest.raises(RankFailure) as info:
        world3.run(ranks.raise_on, 1, timeout=60)
    assert not isinstance(info.value, WorldTimeout)
    assert info.value.ranks == [1]
    assert "ValueError: planted failure on rank 1" in info.value.failures[1]
    assert sorted(info.value.stuck) == [0, 2]  # they waited in the barrier and show where
    assert "barrier" in info.value.stuck[0]
    assert world3.run(ranks.rank_and_sum)[0] == (0, N, 3.0)  # the same World object works again


def test_rank_failing_in_the_implementation_ends_its_stuck_peers_with_its_verdict(world3):
    """A rank that has its verdict from the code under test's failure returns; its peers, blocked inside
    the code under test, are ended after the grace (not at the deadline, 600 s here) and the verdict is
    that rank's failure, with their stacks and the results that did come back."""
    with pytest.raises(ImplementationFailure) as info:
        world3.run(ranks.verdict_on, 2, timeout=600)
    first = str(info.value).splitlines()[0]
    assert first.startswith("rank 2: raised ValueError: odd length 1 (ranks [0, 1] of 3 were still inside"), first
    assert verdict_of(info.value) == first and info.value.ranks == [2] and sorted(info.value.stuck) == [0, 1]
    assert "barrier" in info.value.stuck[0] and info.value.results == {2: {"problems": [first.split(" (")[0]]}}
    assert world3.run(ranks.rank_and_sum)[0] == (0, N, 3.0)  # respawned, usable
    # where the peers return after all, the call returns every result (the verdicts are in them)
    got = world3.run(ranks.verdict_on, 2, True, timeout=600)
    assert got[2] == {"problems": ["rank 2: raised ValueError: odd length 1"]} and got[0] == {"problems": []}
    per_rank = run_or_fail(world3, ranks.verdict_on, 1, failed=lambda detail: {"failed": detail})
    assert len(per_rank) == N and all(r == per_rank[0] for r in per_rank)
    assert per_rank[0]["failed"].startswith("rank 1: raised ValueError: odd length 1 (ranks [0, 2] of 3 were still")
    assert world3.run(ranks.rank_and_sum)[0] == (0, N, 3.0)  # respawned after the failure


def test_the_grace_ends_once_the_peers_are_blocked_and_not_while_one_computes(world3, monkeypatch):
    """After a rank raised, its peers' grace lasts while any of them uses the CPU (rank 0 here, computing 1.5 CPU
    seconds and returning) and ends once every one left is blocked (rank 2, in a barrier the failed rank never
    joins) — not at the grace's end: made 120 s here, the call is over long before it (a grace that ended on
    one idle peer would have ended rank 0 too; one that never ended early would take the 120 s)."""
    import harness.runtime.world as world_module

    monkeypatch.setattr(world_module, "_PEER_GRACE_S", 120.0)
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        world3.run(ranks.raise_while_a_peer_computes, 1, 0, 1.5, timeout=600)
    took = time.monotonic() - started
    assert info.value.ranks == [1] and sorted(info.value.stuck) == [2], (info.value.ranks, info.value.stuck)
    assert "barrier" in info.value.stuck[2]
    assert took < 60, f"the grace was waited out ({took:.0f} s): blocked peers were not seen idle"
    assert world3.run(ranks.rank_and_sum)[0] == (0, N, 3.0)


def test_a_raising_rank_is_named_with_its_exception_in_the_first_line(world3):
    with pytest.raises(RankFailure) as info:
        world3.run(ranks.raise_on, 1, timeout=60)
    assert verdict_of(info.value).startswith("rank 1: ValueError: planted failure on rank 1 (rank(s) [1] of 3 "
                                             "raised during raise_on; ranks [0, 2] were stuck waiting for them")


def test_failure_with_a_collective_in_flight_leaves_no_stale_bytes(world3):
    """Found with DTensor: the other ranks returned with an all-reduce in flight, and its bytes landed in
    the next call's collective (gloo: "Received data size doesn't match", then an abort). A failed call
    now always respawns the world."""
    world3.run(ranks.rank_and_sum)  # alive, whatever the test before left
    spawned = world3.spawn_count
    with pytest.raises(RankFailure, match="respawned"):
        world3.run(ranks.raise_with_collective_in_flight, 1, timeout=60)
    assert world3.run(ranks.rank_and_sum) == [(r, N, 3.0) for r in range(N)]
    assert world3.spawn_count == spawned + 1


def test_rank_that_hangs_times_out_with_stacks(world3):
    start = time.monotonic()
    with pytest.raises(WorldTimeout) as info:
        world3.run(ranks.hang_on, 2, timeout=4)
    elapsed = time.monotonic() - start
    assert elapsed < 4 + 10, f"deadline 4 s, reported after {elapsed:.1f} s"
    assert 2 in info.value.ranks
    assert "in hang_on" in info.value.failures[2] and "sleep" not in info.value.failures[0]
    assert "barrier" in info.value.failures[0]
    spawned = world3.spawn_count
    assert world3.run(ranks.rank_and_sum)[2] == (2, N, 3.0)
    assert world3.spawn_count == spawned + 1  # the stuck world was replaced by a fresh one


def test_rank_that_dies_is_reported_at_once_with_its_exit_code(world3):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        world3.run(ranks.exit_on, 1, 3, timeout=60)
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"a dead rank must be seen at once, not at the 60 s deadline ({elapsed:.1f} s)"
    assert 1 in info.value.ranks and "exit code 3" in info.value.failures[1]
    assert verdict_of(info.value).startswith("rank 1 died with exit code 3 during exit_on (1 rank(s) [1] of 3 died")
    assert world3.run(ranks.rank_and_sum)[1] == (1, N, 3.0)


def test_a_rank_killed_by_a_fatal_signal_is_named_with_where_it_was(world3):
    """A segfault in a rank (a native crash under torch) was "killed by signal SIGSEGV during <call>" alone: now the
    rank's faulthandler dump names the frame it was in, and the failure keeps the whole dump."""
    import inspect

    with pytest.raises(RankFailure) as info:
        world3.run(ranks.segfault_on, 1, timeout=60)
    line = inspect.getsourcelines(ranks.segfault_on)[1] + 5  # the ctypes.string_at(0) line
    assert verdict_of(info.value).startswith(f"rank 1 was killed by signal SIGSEGV during segfault_on (in segfault_on "
                                             f"at ranks.py:{line}) (1 rank(s) [1] of 3 died"), verdict_of(info.value)
    assert "Fatal Python error: Segmentation fault" in info.value.failures[1], info.value.failures[1][:500]
    assert world3.run(ranks.rank_and_sum)[1] == (1, N, 3.0)


def test_unpicklable_function_is_refused_clearly(world3):
    with pytest.raises(TypeError, match="module-level function"):
        world3.run(lambda: None)


def test_unpicklable_result_is_a_rank_failure(world3):
    with pytest.raises(RankFailure) as info:
        world3.run(ranks.unpicklable_result)
    assert info.value.ranks == [0, 1, 2]
    assert world3.run(ranks.rank_and_sum)[0][0] == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"size": 0}, "World size must be a whole number >= 1"),
    ({"size": 2, "backend": "mpi"}, "backend must be 'gloo', 'nccl' or None"),
    ({"size": 2, "timeout": 0}, "timeout must be positive"),
])
def test_bad_arguments_are_one_clear_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        World(**kwargs)


def test_nccl_without_a_device_per_rank_is_one_sentence_before_any_rank_starts():
    """Before: every rank died at start-up in torch.cuda.set_device (a RankFailure with a traceback per rank)."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError) as exc:
        World(visible + 1, backend="nccl")
    assert str(exc.value) == (f"a World of {visible + 1} rank(s) on nccl needs a CUDA device per rank; {visible} "
                              "visible here — use backend 'gloo' (or None: nccl where there are enough, else gloo).")


def test_context_manager_closes_the_ranks():
    with World(1, timeout=60) as w:
        assert w.run(ranks.rank_and_sum) == [(0, 1, 0.0)]
        procs = list(w._procs)
    assert not w.alive and all(not p.is_alive() for p in procs)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="named semaphores live in /dev/shm on Linux")
def test_a_rank_leaves_without_leaking_the_semaphores_it_made():
    """A rank leaves by ``os._exit`` (no interpreter teardown) but runs multiprocessing's finalizers first: a named
    semaphore it kept is unlinked when the World closes, not by the parent's resource tracker at its exit with a
    "leaked semaphore objects" warning (``paritybench bench matrix``'s compiled cases: tqdm's lock)."""
    with World(1, timeout=60) as w:
        [path] = w.run(ranks.keeps_a_named_semaphore)
        assert os.path.exists(path), path
    assert not os.path.exists(path), path


def test_without_multiprocessing_s_private_finalizers_a_rank_still_leaves(monkeypatch):
    """The guard's fallback: a Python whose ``multiprocessing.util`` lacks ``_run_finalizers`` runs none (the
    tracker's own clean-up then); one whose finalizer raises still lets the rank leave."""
    import multiprocessing.util

    from harness.runtime.rank import run_multiprocessing_finalizers

    monkeypatch.delattr(multiprocessing.util, "_run_finalizers")
    assert run_multiprocessing_finalizers() is False
    monkeypatch.setattr(multiprocessing.util, "_run_finalizers", lambda minpriority: 1 / 0, raising=False)
    assert run_multiprocessing_finalizers() is False
    monkeypatch.setattr(multiprocessing.util, "_run_finalizers", lambda minpriority: None)
    assert run_multiprocessing_finalizers() is True


def test_a_fresh_rank_starts_with_the_fork_servers_modules_imported():
    """``harness.runtime.spawn.PRELOAD`` (torch's distributed modules) are imported once, by the fork server: a new
    World's ranks have them before their first call, and import none of them again (~2 s of a World of 4)."""
    with World(1, timeout=60) as w:
        assert w.run(ranks.not_imported, list(PRELOAD)) == [[]]


STACK_MODULES = {"torchtitan": ["torchtitan.models.llama3", "torchtitan.distributed"],
                 "megatron": ["megatron.core", "megatron.core.models.gpt"]}


def test_a_fresh_rank_starts_with_the_sessions_stacks_imported():
    """The third-party stacks this session's tests run (``harness.pytest.session.pytest_collection_finish``), installed,
    on a CPU-only torch, are imported by the fork server: a new World's rank has their modules before its first call
    (in a session that selects none, or on a CUDA build, the list is empty)."""
    from harness.runtime import spawn

    with World(1, timeout=60) as w:
        assert w.run(ranks.not_imported, [m for name in spawn.preload_stacks([]) for m in STACK_MODULES[name]]) == [[]]


def test_stacks_are_preloaded_only_on_a_cpu_build_and_before_the_server_starts(monkeypatch):
    """``preload_stacks``: nothing on a CUDA build (a stack's import touching CUDA in the fork server would reach every
    fork), nothing the registry says cannot run here or without an importer, nothing once the server runs."""
    import torch

    from harness.runtime import spawn

    monkeypatch.setattr(spawn, "_STACKS", [])
    monkeypatch.setattr(spawn, "_CTX", None)
    monkeypatch.setattr(spawn, "_runs_here", lambda stack: stack != "megatron")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert spawn.preload_stacks(["torchtitan", "megatron"]) == []
    monkeypatch.setattr(torch.version, "cuda", None)
    assert spawn.preload_stacks(["torchtitan", "megatron", "deepspeed"]) == ["torchtitan"]
    monkeypatch.setattr(spawn, "_runs_here", lambda stack: True)
    monkeypatch.setattr(spawn, "_CTX", object())  # the server started: it imports what it was told then
    assert spawn.preload_stacks(["megatron"]) == ["torchtitan"]


def test_a_stack_the_fork_server_cannot_import_is_left_to_the_ranks(monkeypatch):
    """``harness.runtime.preload.load`` never raises (the server must live): a stack whose import raises is named with
    its error and left out — its ranks import it themselves and meet the same error where they did before."""
    from harness.runtime import preload

    def broken():
        raise RuntimeError("no such release")

    monkeypatch.setitem(preload.IMPORTS, "megatron", broken)
    assert preload.load(["megatron"]) == {"megatron": "RuntimeError: no such release"}


def test_reading_the_preload_names_imports_no_stack():
    """A driver that imports ``harness.runtime.preload`` (for ``named_in``, ``ENV``) imports no stack, even with ``ENV``
    exported by its user: only the fork server's ``harness.runtime.preload_server`` loads what ``ENV`` names (a fresh
    interpreter: this one may have imported the stacks already)."""
    from harness.runtime import preload

    probe = ("import sys; from harness.runtime import preload; print(preload.named_by_environment(), "
             "sorted({m.split('.')[0] for m in sys.modules} & set(preload.IMPORTS)))")
    env = {**os.environ, preload.ENV: "megatron,no-such-stack,torchtitan"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split("\n")[0] == "['megatron', 'torchtitan'] []", out.stdout + out.stderr


def _hang_line(exc) -> str:
    return verdict_of(exc).split(" (no rank progressed")[0]


@pytest.fixture
def short_window(world3):
    """world3 calling a hang after 3 s without progress instead of 10 (the default's verdict took 11.2 s)."""
    gloo_only(world3, "a wait the hang window reads as idle is gloo's")
    with hang_window(world3, 3.0):
        yield world3


def test_a_hung_rank_is_named_with_the_collective_it_never_entered_and_where_it_is(short_window):
    """Rank 2 sleeps before the 17th all-reduce its peers wait in: the verdict comes when no rank has progressed
    for the hang window (not at the 600 s deadline), names the collective by its number on the world group
    (counted from what this World did before) and rank 2's own frame; the World is usable after."""
    world3 = short_window
    before = world3.run(ranks.world_collectives)
    assert len(set(before)) == 1, before
    with pytest.raises(WorldHang) as info:
        world3.run(ranks.sleep_before_collective, 2, 16, timeout=600)
    line = inspect.getsourcelines(ranks.sleep_before_collective)
    sleep_at = line[1] + next(i for i, text in enumerate(line[0]) if "time.sleep" in text)
    assert _hang_line(info.value) == (f"rank 2 never entered all_reduce #{before[0] + 17} on the world group that "
                                      f"ranks 0 and 1 wait in; rank 2 is in sleep_before_collective at ranks.py:"
                                      f"{sleep_at}"), verdict_of(info.value)
    assert "no rank progressed in sleep_before_collective for 3 s" in verdict_of(info.value)
    assert info.value.ranks == [0, 1, 2] and "all_reduce" in info.value.failures[0]  # every stack kept
    assert world3.run(ranks.rank_and_sum)[2] == (2, N, 3.0)


def test_a_hung_subgroup_names_the_group_by_its_ranks(short_window):
    """Rank 1 waits in a world barrier while rank 0 waits in an all-reduce on group [0, 1] (rank 2 sleeps):
    each waiting collective is named, with the rank that is elsewhere."""
    with pytest.raises(WorldHang) as info:
        short_window.run(ranks.wait_in_a_subgroup, 1, timeout=600)
    line = _hang_line(info.value)
    assert re.fullmatch(r"rank 1 waits in barrier #(\d+) on the world group while rank 0 waits in all_reduce #1 on "
                        r"group \[0, 1\]; rank 1 is in wait_in_a_subgroup at ranks.py:\d+; rank 2 never entered "
                        r"barrier #\1 on the world group that rank 1 waits in; rank 2 is in wait_in_a_subgroup at "
                        r"ranks.py:\d+", line), line


def _computing_rank_is_not_hung(world, seconds: float, window: float) -> None:
    with hang_window(world, window):
        assert world.run(ranks.compute_while_peers_wait, 1, seconds, timeout=seconds + 120) == [7.0] * world.size


def test_a_rank_computing_four_windows_long_is_not_called_hung(world3):
    _computing_rank_is_not_hung(world3, seconds=4.0, window=1.0)  # its peers wait 4 windows in a broadcast


@pytest.mark.thorough
def test_a_rank_computing_60_s_is_not_called_hung(world3):
    _computing_rank_is_not_hung(world3, seconds=60.0, window=world3.hang_window)


def test_the_hang_window_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("PARITYBENCH_HANG_WINDOW_S", "2.5")
    assert World(2).hang_window == 2.5
    monkeypatch.setenv("PARITYBENCH_HANG_WINDOW_S", "ten")
    with pytest.raises(ValueError, match="PARITYBENCH_HANG_WINDOW_S must be seconds .* got 'ten'"):
        World(2)


def test_an_exception_is_described_by_its_first_line_with_text_and_by_its_cause():
    """A verdict's line names what went wrong: torch's pipelining raises "\\n   [Stage 0] failed to run forward:" from
    the stage's own error (a first line of blanks, the cause after ``from``) — both are in the one line."""
    from harness.errors import describe

    assert describe(ValueError("first\nsecond")) == "ValueError: first"
    try:
        try:
            raise RuntimeError("INTERNAL ASSERT FAILED at reducer.cpp\ndetails")
        except RuntimeError as inner:
            raise RuntimeError("\n    [Stage 0] failed to run forward:\n    args: ()") from inner
    except RuntimeError as outer:
        line = describe(outer)
    assert line == ("RuntimeError: [Stage 0] failed to run forward: from RuntimeError: INTERNAL ASSERT FAILED at "
                    "reducer.cpp"), line
    assert describe(KeyError()) == "KeyError: "


def test_a_test_that_needs_gloo_skips_elsewhere_with_its_reason_and_the_backend():
    """``suites._support.worlds.gloo_only``: on gloo nothing happens; on any other backend the test skips saying why
    and what the World runs."""
    from types import SimpleNamespace

    assert gloo_only(SimpleNamespace(backend="gloo"), "a CPU finding") is None
    with pytest.raises(pytest.skip.Exception, match=r"^a CPU finding; this World runs nccl$"):
        gloo_only(SimpleNamespace(backend="nccl"), "a CPU finding")


def test_summed_adds_each_value_over_the_group_in_float64_on_every_rank(world3):
    """``harness.runtime.rank.summed``, how the stacks read their step's loss: every rank gets the sums, over the world
    or a group of ranks, in float64 (three 0.1s: 0.30000000000000004 — in float32 they would read 0.30000001...)."""
    tenths = 0.1 + 0.1 + 0.1  # equal terms: any order of the reduction gives this
    got = world3.run(ranks.summed_here)
    assert got == [([3.0, 3.0, tenths], [1.0]), ([3.0, 3.0, tenths], [1.0]), ([3.0, 3.0, tenths], [])], got
