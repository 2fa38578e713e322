"""The gate's verdicts: one record per judged thing, ``regression`` True for what fails the gate.

Rules (results/README.md, "What the gate judges"):

- Conformance (no statistics). Per conformance case (``results.CONFORMANCE_KEY``): passed in the
  baseline and fails / errors / is a known non-conformance now, or is now only unsupported or refused.
  Per property (suite, property, impl, backend): present in the baseline and missing now; fewer examples
  per run than the baseline's fewest (a silently thinner suite); failing examples the baseline's property
  never had (hypothesis may draw new ones), named by the smallest failing case. A benchmark case
  (``results.BENCHMARK_KEY``) that ran (status ok) and is now wrong, failed, unsupported or missing.
- Deterministic figures (``EXACT_COLUMNS``): any increase, or a figure measured before and blank now.
- Times: every timed iteration (samples.csv) through ``stats.ratio_interval``; a regression only when
  the whole confidence interval of new / baseline lies above 1 + threshold.

A merged baseline holds several runs: samples are pooled, counts are per run, figures take the largest.
"""

from __future__ import annotations

import math
from statistics import median

from harness.records.results import BENCHMARK_KEY, CONFORMANCE_KEY

from .stats import mean_shift_interval, ratio_interval, run_interval, verdict

EXACT_COLUMNS = {
    "comm_bytes_measured": "bytes one rank sends per step",
    "mem_params_bytes": "parameter bytes per rank", "mem_grads_bytes": "gradient bytes per rank",
    "mem_optimizer_bytes": "optimizer-state bytes per rank", "act_peak_bytes": "peak saved-activation bytes",
    "alloc_peak_bytes": "allocator peak bytes", "bubble_simulated": "bubble of the schedule simulated at unit cost",
    "peak_activations_measured": "most stage activations a pipeline rank held at once",
    "state_bytes_rank_max": "checkpoint bytes the busiest rank writes",
}
"""Deterministic figures: the same code gives the same value, so any increase is a regression."""
FAILING = {"fail", "error", "known-nonconformance"}
AGGREGATE = "aggregate between runs"
"""The ``method`` of an implementation's aggregate time record (``_aggregates``)."""
GROUP = ["suite", "property", "impl", "backend"]


def _text(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def keys(df, columns: list[str]) -> list[tuple]:
    """Each row's key as a tuple of normalised strings (blank for missing; 4.0 -> "4")."""
    cols = [df[c].tolist() if c in df else [None] * len(df) for c in columns]
    return [tuple(_text(v) for v in values) for values in zip(*cols, strict=True)] if columns else []


def label(key: tuple, columns: list[str], skip=("backend",)) -> str:
    """A case in one line: its non-blank key values, the less obvious ones named."""
    named = {"world_size": "n", "bytes": "bytes", "numel": "numel", "microbatches": "m", "virtual_stages": "v",
             "zero_stage": "stage", "root": "root", "in_place": "in_place", "group": "group", "seed": "seed",
             "count": "count"}
    parts = [f"{named[c]}={v}" if c in named else v for c, v in zip(columns, key, strict=True)
             if v and c not in skip]
    return " ".join(parts)


def _record(kind, case, verdict, regression, detail="", **extra) -> dict:
    return {"kind": kind, "case": case, "verdict": verdict, "regression": regression, "detail": detail, **extra}


def conformance(base, new) -> list[dict]:
    out = []
    bconf, nconf = base.conformance, new.conformance
    bkeys, nkeys = keys(bconf, CONFORMANCE_KEY), keys(nconf, CONFORMANCE_KEY)
    b_outcomes: dict[tuple, set] = {}
    for k, o in zip(bkeys, bconf["outcome"].tolist(), strict=True):
        b_outcomes.setdefault(k, set()).add(o)
    n_rows: dict[tuple, list] = {}
    for k, o, d in zip(nkeys, nconf["outcome"].tolist(), nconf["detail"].tolist(), strict=True):
        n_rows.setdefault(k, []).append((o, _text(d)))
    groups = _groups(bkeys, bconf), _groups(nkeys, nconf)
    for g in sorted(set(groups[0]) | set(groups[1])):
        out += _judge_group(g, groups[0].get(g), groups[1].get(g), b_outcomes, n_rows)
    return out


def _groups(case_keys, conf) -> dict:
    """(suite, property, impl, backend) -> {"cases": [case keys], "per_run": examples per run}."""
    idx = [CONFORMANCE_KEY.index(c) for c in GROUP]
    out: dict = {}
    run_ids = conf["run_id"].tolist() if "run_id" in conf else [""] * len(case_keys)
    for k, rid in zip(case_keys, run_ids, strict=True):
        entry = out.setdefault(tuple(k[i] for i in idx), {"cases": [], "runs": {}})
        entry["cases"].append(k)
        entry["runs"][rid] = entry["runs"].get(rid, 0) + 1
    for entry in out.values():  # per run that has the property (a merged run may join a pytest and a bench run)
        counts = list(entry["runs"].values())
        entry["fewest"], entry["per_run"] = min(counts), sum(counts) / len(counts)
    return out


def _judge_group(g, b, n, b_outcomes, n_rows) -> list[dict]:
    name = label(g, GROUP)
    if n is None:
        return [_record("conformance", name, "missing", True, f"ran {b['per_run']:g} example(s) per run in the "
                                                               "baseline; none now")]
    if b is None:
        return [_record("conformance", name, "new", False, f"{n['per_run']:g} example(s), not in the baseline")]
    out = []
    failing = [(k, o, d) for k in dict.fromkeys(n["cases"]) for o, d in n_rows[k] if o in FAILING]
    b_failed = any(b_outcomes.get(k, set()) & FAILING for k in b["cases"])
    # a case regressed when the baseline passed it and never failed it (a key that does not tell examples
    # apart may hold both), or when it is new and the baseline's property never failed at all
    regressed = [(k, o, d) for k, o, d in failing
                 if ("pass" in b_outcomes.get(k, set()) and not b_outcomes[k] & FAILING) or not b_failed]
    if regressed:
        k, o, d = min(regressed, key=lambda r: _size(r[0]))
        out.append(_record("conformance", name, "fails", True, f"{len(regressed)} failing example(s); smallest: "
                           f"{label(k, CONFORMANCE_KEY, skip=tuple(GROUP))}: {o}: {d}"))
    elif failing:
        out.append(_record("conformance", name, "still failing", False, f"{len(failing)} failing example(s), as "
                           "in the baseline"))
    lost = [k for k in dict.fromkeys(n["cases"]) if "pass" in b_outcomes.get(k, set())
            and {o for o, _ in n_rows[k]} <= {"unsupported", "refused"}]
    if lost:
        out.append(_record("conformance", name, "now unsupported", True, f"{len(lost)} case(s) that passed are now "
                           f"unsupported or refused, e.g. {label(lost[0], CONFORMANCE_KEY, skip=tuple(GROUP))}"))
    if n["per_run"] < b["fewest"]:
        out.append(_record("conformance", name, "thinner", True, f"{n['per_run']:g} example(s) per run, the "
                           f"baseline ran at least {b['fewest']}"))
    if not out:
        out.append(_record("conformance", name, "ok", False, f"{n['per_run']:g} example(s) per run"))
    return out


def _size(key: tuple) -> tuple:
    """Order failing cases smallest first: world size, then numel (the minimal line names the first)."""
    def num(v):
        try:
            return float(v)
        except ValueError:
            return math.inf
    return num(key[CONFORMANCE_KEY.index("world_size")]), num(key[CONFORMANCE_KEY.index("numel")]), key


def _by_key(df) -> dict:
    out: dict = {}
    for k, row in zip(keys(df, BENCHMARK_KEY), df.to_dict("records"), strict=True):
        out.setdefault(k, []).append(row)
    return out


def benchmarks(base, new, threshold: float, confidence: float) -> list[dict]:
    """Benchmark status, deterministic figures and times of every benchmark case in the baseline or NEW."""
    brows, nrows = _by_key(base.benchmarks), _by_key(new.benchmarks)
    bsamples, nsamples = _samples(base.samples), _samples(new.samples)
    out = []
    for k in sorted(set(brows) | set(nrows)):
        case = label(k, BENCHMARK_KEY)
        b_ok = any(r["status"] == "ok" for r in brows.get(k, []))
        n_status = sorted({r["status"] for r in nrows.get(k, [])})
        if k not in nrows:
            out.append(_record("benchmark", case, "missing", b_ok, "ran in the baseline; not in NEW"))
            continue
        if b_ok and n_status != ["ok"]:
            detail = next((_text(r.get("detail")) for r in nrows[k] if r["status"] != "ok"), "")
            out.append(_record("benchmark", case, "now " + "/".join(s for s in n_status if s != "ok"), True, detail))
            continue
        if k not in brows or not b_ok:
            continue
        out += _figures(case, brows[k], nrows[k])
        if k in bsamples and k in nsamples:
            out.append(_time(case, k, bsamples[k], nsamples[k], threshold, confidence))
        else:
            out.append(_record("time", case, "not judged", False, "no per-iteration samples (samples.csv) in "
                               + ("the baseline" if k not in bsamples else "NEW")))
    return out + _aggregates(bsamples, nsamples, threshold, confidence)


def _time(case: str, key: tuple, base: dict, new: dict, threshold: float, confidence: float) -> dict:
    """One case's time verdict: between runs where the baseline has several (``stats.run_interval``), else
    over iterations (``stats.ratio_interval``), which cannot see run-to-run variation."""
    between = len(base) >= 2
    if between:
        ri = run_interval(list(base.values()), list(new.values()), confidence)
        method = f"between runs ({len(base)} vs {len(new)})"
    else:
        ri = ratio_interval([t for r in base.values() for t in r], [t for r in new.values() for t in r], confidence)
        method = "iterations (one baseline run: run-to-run variation not measured)"
    v = ri.verdict(threshold)
    own = key[0] == "world"  # the harness's own dispatch overhead: shown, never the implementation's regression
    return _record("time", case, v, v == "slower" and not own,
                   ("harness overhead, informational: " if own else "")
                   + f"median {ri.base_median:.4g} -> {ri.new_median:.4g} us",
                   ratio=ri.ratio, low=ri.low, high=ri.high, base_n=ri.base_n, new_n=ri.new_n, method=method)


def _aggregates(bsamples: dict, nsamples: dict, threshold: float, confidence: float) -> list[dict]:
    """Per implementation (suite, impl, backend), where the baseline has several runs: each run's mean over
    the cases both sides timed of log(run median / the baseline's mean log median of the case), compared
    between runs (``stats.mean_shift_interval``). A slowdown spread over many cases shows here before any
    single case's interval clears the threshold: the run-to-run spread of a mean over cases is smaller."""
    groups: dict = {}
    for k in set(bsamples) & set(nsamples):
        if k[0] != "world" and len(bsamples[k]) >= 2:
            groups.setdefault((k[0], k[2], k[3]), []).append(k)
    out = []
    for (suite, impl, backend), cases in sorted(groups.items()):
        runs_b = sorted(set.intersection(*(set(bsamples[k]) for k in cases)))
        runs_n = sorted(set.intersection(*(set(nsamples[k]) for k in cases)))
        if len(cases) < 2 or len(runs_b) < 2 or not runs_n:
            continue
        mu = {k: sum(math.log(median(bsamples[k][r])) for r in runs_b) / len(runs_b) for k in cases}

        def effect(samples, run, mu=mu, cases=cases):
            return sum(math.log(median(samples[k][run])) - mu[k] for k in cases) / len(cases)

        d, lo, hi = mean_shift_interval([effect(bsamples, r) for r in runs_b], [effect(nsamples, r) for r in runs_n],
                                        confidence)
        v = verdict(math.exp(d), math.exp(lo), math.exp(hi), threshold)
        out.append(_record("time", f"{suite} {impl} {backend} (all {len(cases)} timed cases)", v, v == "slower",
                           f"mean log ratio over the cases, between runs ({len(runs_b)} vs {len(runs_n)})",
                           ratio=math.exp(d), low=math.exp(lo), high=math.exp(hi), method=AGGREGATE))
    return out


def _samples(df) -> dict:
    """Case key -> {run_id: that run's per-iteration times}."""
    out: dict = {}
    run_ids = df["run_id"].tolist() if "run_id" in df else [""] * len(df)
    for k, rid, t in zip(keys(df, BENCHMARK_KEY), run_ids, df["time_us"].tolist(), strict=True):
        if t > 0:
            out.setdefault(k, {}).setdefault(rid, []).append(float(t))
    return out


def _figures(case: str, brows: list[dict], nrows: list[dict]) -> list[dict]:
    out = []
    for col, what in EXACT_COLUMNS.items():
        bvals = [r[col] for r in brows if _text(r.get(col))]
        nvals = [r[col] for r in nrows if _text(r.get(col))]
        if not bvals:
            continue
        b, varies = max(bvals), len(set(bvals)) > 1
        note = " (not constant over the baseline's runs: compared with its largest)" if varies else ""
        if not nvals:
            out.append(_record("figure", f"{case} {col}", "no longer measured", True, f"{what}: {b:g} -> blank"))
            continue
        n = max(nvals)
        verdict = "larger" if n > b else "smaller" if n < b else "equal"
        out.append(_record("figure", f"{case} {col}", verdict, n > b, f"{what}: {b:g} -> {n:g}{note}",
                           ratio=n / b if b else (math.inf if n else 1.0)))
    return out


def compare(base, new, threshold: float, confidence: float) -> list[dict]:
    return conformance(base, new) + benchmarks(base, new, threshold, confidence)
