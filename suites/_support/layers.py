"""The layer-level suites' verdict (context parallel, expert parallel): one case on the session's World of ``n``
ranks, its ranks reduced to one outcome (``harness.verdict.reduce``), recorded as a conformance row."""

from __future__ import annotations

from harness.runtime.world import run_or_fail
from harness.verdict import reduce, worst


def judge_layer(world_cache, conformance, suite: str, run_case, failed, impl: str, n: int, case):
    """(outcome, refusal or None, problems, per_rank) of ``run_case(impl, case)`` on ``n`` ranks."""
    from dataclasses import asdict

    per_rank = run_or_fail(world_cache.get(n), run_case, impl, asdict(case), timeout=120, failed=failed)
    v = reduce(per_rank)
    conformance.record(v.outcome, suite=suite, world_size=n, dtype="float64", impl=impl, collective=case.label(),
                       max_rel_err=worst(per_rank), detail=v.detail)
    return v.outcome, v.refused, v.problems, per_rank


def judge_context_parallel(world_cache, conformance, impl: str, cp: int, case):
    from harness.context_parallel.case import failed, run_case

    return judge_layer(world_cache, conformance, "context_parallel", run_case, failed, impl, cp, case)


def judge_expert_parallel(world_cache, conformance, impl: str, n: int, case):
    from harness.expert_parallel.case import failed, run_case

    return judge_layer(world_cache, conformance, "expert_parallel", run_case, failed, impl, n, case)


def judge_low_precision(world_cache, conformance, impl: str, case):
    from harness.low_precision.case import failed, run_case

    return judge_layer(world_cache, conformance, "low_precision", run_case, failed, impl, case.world, case)


def judge_muon(world_cache, conformance, impl: str, case):
    from harness.muon.case import failed, run_case

    return judge_layer(world_cache, conformance, "muon", run_case, failed, impl, case.world, case)
