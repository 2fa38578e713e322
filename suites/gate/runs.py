"""Synthetic run folders for the gate's tests, written by the real writer (``RunDir``)."""

from __future__ import annotations

import random

from harness.records.results import RunDir

META = {"suite": "collectives", "backend": "gloo", "backends": ["gloo"], "placement": {"2": {}, "4": {}},
        "config": {"collectives": {"hidden": 512, "iters": 20, "impls": ["torch"]}}}


def bench_row(op="all_reduce", n=2, nbytes=1 << 20, impl="torch", **extra) -> dict:
    return {"suite": "collectives", "op": op, "impl": impl, "backend": "gloo", "world_size": n, "dtype": "float32",
            "reduce_op": "sum", "bytes": nbytes, "count": nbytes // 4 if nbytes else None, "iters": 20, "warmup": 3,
            "status": "ok", "wrong": 0, **extra}


def conf_row(prop="test_x[torch]", n=2, numel=7, outcome="pass", **extra) -> dict:
    return {"suite": "collectives", "property": prop, "impl": "torch", "backend": "gloo", "world_size": n,
            "dtype": "float32", "collective": "all_reduce", "op": "sum", "numel": numel, "root": 0, "in_place": False,
            "seed": 1, "outcome": outcome, "wrong": 0 if outcome == "pass" else 3, **extra}


def times(median_us: float, n: int = 20, spread: float = 0.02, seed: int = 0) -> list[float]:
    """``n`` iteration times around ``median_us`` with a few percent of multiplicative noise."""
    rng = random.Random(seed)
    return [median_us * rng.lognormvariate(0, spread) for _ in range(n)]


def write_run(base, bench=(), conf=(), meta=None, status="complete", seed=0) -> str:
    """A finished run folder; each bench row's ``samples_us`` defaults to 20 times around 1000 us (its
    ``median_us`` key, when given, moves them)."""
    run = RunDir(base, {**META, **(meta or {})})
    for i, row in enumerate(bench):
        row = dict(row)
        median = row.pop("median_us", 1000.0)
        if row.get("status", "ok") == "ok" and "samples_us" not in row:
            row["samples_us"] = times(median, seed=seed * 1000 + i)
        run.append("benchmarks.csv", row)
    for row in conf:
        run.append("conformance.csv", row)
    if status == "running":
        for appender in run._files.values():
            appender.close()
    else:
        run.finish(status)
    return str(run.path)


def standard(base, seed=0, **changes) -> str:
    """The sweep both sides of most tests share: 2 ops x 2 sizes x 2 world sizes, 10 property examples."""
    bench = [bench_row(op, n, b) for op in ("all_reduce", "broadcast") for n in (2, 4) for b in (1 << 20, 4 << 20)]
    conf = [conf_row(n=2 + i % 3, numel=i) for i in range(10)]
    return write_run(base, changes.get("bench", bench), changes.get("conf", conf), changes.get("meta"), seed=seed)
