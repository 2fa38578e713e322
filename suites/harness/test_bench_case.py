"""A benchmark case's World call (``harness.runtime.bench_case``): a rank that raises is the case's verdict — every
rank's answer, the whole failure logged — not the sweep's end; and the status a row takes from its ranks' answers."""

from __future__ import annotations

import io
import re

from harness.runtime.bench_case import call_case, declined, judge
from suites._support.worlds import gloo_only, hang_window

from . import ranks


def test_a_rank_that_raises_is_every_ranks_failed_answer_and_the_next_call_runs(world_cache):
    world, log = world_cache.get(2), io.StringIO()
    per_rank = call_case(world, ranks.raise_on, 1, timeout=60, log=log)
    line = per_rank[0]["failed"]
    assert per_rank == [{"failed": line}] * 2
    assert line.startswith("rank 1: ValueError: planted failure on rank 1 (rank(s) [1] of 2 raised during "
                           "raise_on"), line
    said = log.getvalue()
    assert said.startswith(f"paritybench: a case failed, the sweep goes on: {line}\n--- rank 1 ---\nTraceback"), said
    assert world.run(ranks.rank_and_sum, timeout=60) == [(0, 2, 1.0), (1, 2, 1.0)]  # a World respawned for it
    assert call_case(world, ranks.rank_and_sum, log=log) == [(0, 2, 1.0), (1, 2, 1.0)]  # answers as they are


def test_a_case_that_hangs_is_every_ranks_failed_answer_named_in_the_window_and_the_next_call_runs(world_cache):
    """Rank 1 never enters the all-reduce rank 0 waits in (a trainer stuck before its next collective): within the
    hang window (2 s here) the case's answer names it — not the sweep's deadline, not its end; each rank's stack goes
    to the log, and the sweep's next case runs on a respawned World."""
    world, log = world_cache.get(2), io.StringIO()
    gloo_only(world, "a wait the hang window reads as idle is gloo's")
    with hang_window(world, 2.0):
        per_rank = call_case(world, ranks.sleep_before_collective, 1, 0, timeout=600, log=log)
    line = per_rank[0]["failed"]
    assert per_rank == [{"failed": line}] * 2
    assert line.startswith("rank 1 never entered all_reduce #") and "that rank 0 waits in" in line, line
    assert "no rank progressed in sleep_before_collective for 2 s: a deadlock" in line, line
    said = log.getvalue()
    assert said.startswith(f"paritybench: a case failed, the sweep goes on: {line}"), said
    rank1 = said.split("--- rank 1 ---\n", 1)[1].split("--- rank ", 1)[0]
    assert re.search(r'ranks\.py", line \d+ in sleep_before_collective', rank1), said
    assert call_case(world, ranks.rank_and_sum, log=log) == [(0, 2, 1.0), (1, 2, 1.0)]


def test_the_row_status_failed_before_unsupported_and_none_where_every_rank_finished():
    assert declined([{"failed": "rank 1: X"}, {"failed": "rank 1: X"}]) == {"status": "failed", "detail": "rank 1: X"}
    assert declined([{"unsupported": "no fp8 on gloo"}, {"times": [1.0]}]) == \
        {"status": "unsupported", "detail": "no fp8 on gloo"}
    assert declined([{"unsupported": "a"}, {"failed": "rank 1: X"}]) == {"status": "failed", "detail": "rank 1: X"}
    assert declined([{"times": [1.0], "unsupported": None}, {"times": [2.0], "unsupported": None}]) == {}


def test_a_timed_row_the_suites_verdict_fails_is_wrong_with_its_first_problem_ahead_of_its_detail():
    row = judge({"status": "ok", "detail": "DTensor collectives per step"},
                [{"problems": []}, {"problems": ["rank 1: step 1: w off by 3 E_T", "rank 1: step 2: w"]}])
    assert row == {"status": "wrong", "wrong": 1,
                   "detail": "rank 1: step 1: w off by 3 E_T; DTensor collectives per step"}
    assert judge({"status": "ok"}, [{"problems": ["rank 0: x"]}])["detail"] == "rank 0: x"
    holds = [{"problems": []}, {"refused": "no", "problems": []}]
    assert judge({"status": "ok"}, holds) == {"status": "ok", "wrong": 0}
