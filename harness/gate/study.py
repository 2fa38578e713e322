"""The gate's false-alarm and power study on this machine (the figures behind the default threshold).

    python -m harness.gate.study collect --out DIR [--runs 10] [--power-runs 4]
    python -m harness.gate.study analyze DIR [--time-threshold 10%] [--confidence 0.99]

``collect`` runs the short CI sweep (``SWEEP``: 4 collectives x 1, 4, 16 MiB x world sizes 2, 4, 20
timed iterations) as separate ``paritybench bench collectives`` processes, interleaved so that a change
in the machine's load hits every kind alike: ``--runs`` of the unchanged code (``planted:slowed_0``, torch's
collectives) and ``--power-runs`` of each planted slowdown (10, 20, 50 %, ``planted.py``).

``analyze`` judges them with the gate's own code (``judge.benchmarks``):
- false alarms: every ordered pair of unchanged runs (baseline, new): the share of pairs that flag
  anything, the share of case comparisons flagged, per case; and each unchanged run against a baseline
  merged from the other unchanged runs (the committed-baseline set-up);
- power: every slowed run against every unchanged run, against the merged baseline of all unchanged
  runs, and every ``NEW_RUNS`` slowed runs merged against it: the share of slowed cases flagged
  ``slower`` (the harness's own dispatch row is not slowed and not counted), and of the implementation
  aggregates; with the median ratio the slowdown measured as (``planted.py``: not the planted one);
- false alarms likewise for ``NEW_RUNS`` unchanged runs merged against a baseline of the others.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from pathlib import Path

from .judge import AGGREGATE

SWEEP = ["--ops", "all_reduce,all_gather,reduce_scatter,broadcast", "--min-bytes", "1M", "--max-bytes", "16M",
         "--factor", "4", "--world-sizes", "2,4", "--iters", "20", "--warmup", "3"]
NEW_RUNS = 3
"""The CI set-up the guide recommends on a noisy runner: the short sweep run this many times, merged."""
SLOWDOWNS = {"same": "slowed_0", "slow10": "slowed_10", "slow20": "slowed_20", "slow50": "slowed_50"}


def collect(out: Path, runs: int, power_runs: int) -> None:
    order = [kind for i in range(max(runs, power_runs)) for kind in SLOWDOWNS
             if i < (runs if kind == "same" else power_runs)]
    for i, kind in enumerate(order, 1):
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "harness.cli.main", "bench", "collectives", "--impl",
               f"harness.gate.planted:{SLOWDOWNS[kind]}", *SWEEP, "--results-dir", str(out / kind), "--no-report"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"[{i}/{len(order)}] {kind}: {time.perf_counter() - start:.1f} s", flush=True)


def _load(folder: Path) -> list:
    from .inputs import GateError, load

    loaded = []
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):
        try:
            run = load(str(path))
        except GateError:  # a run still being collected
            continue
        for frame in (run.benchmarks, run.samples, run.conformance):
            frame.loc[frame["impl"].astype(str).str.startswith("harness.gate.planted"), "impl"] = "planted"
        loaded.append(run)
    return loaded


def _pooled(runs: list):
    import pandas as pd

    from .inputs import Run

    return Run("merged", runs[0].meta, pd.concat([r.conformance for r in runs]),
               pd.concat([r.benchmarks for r in runs]), pd.concat([r.samples for r in runs]), runs=len(runs))


def _times(base, new, threshold, confidence) -> list[dict]:
    from . import judge

    return [r for r in judge.benchmarks(base, new, threshold, confidence) if r["kind"] == "time"]


def _regressions(base, new, threshold, confidence) -> tuple[list[str], int]:
    """Everything the gate would fail on (conformance, figures, times): a false alarm between unchanged runs;
    and how many times it judged."""
    from . import judge

    records = judge.compare(base, new, threshold, confidence)
    return [f"{r['kind']}: {r['case']}" for r in records if r["regression"]], sum(r["kind"] == "time" for r in records)


def _timed_case(r: dict) -> bool:
    """A single timed case of the planted implementation (not the harness's dispatch row, not an aggregate)."""
    return not r["case"].startswith("world") and r.get("method") != AGGREGATE


def _aggregate(r: dict) -> bool:
    return r.get("method") == AGGREGATE


def _share(records: list[dict]) -> str:
    hit = sum(r["verdict"] == "slower" for r in records)
    return f"{hit}/{len(records)} ({hit / max(len(records), 1):.0%})"


def analyze(folder: Path, threshold: float, confidence: float) -> str:
    same = _load(folder / "same")
    lines = [f"threshold {threshold:.0%}, confidence {confidence:g}; {len(same)} unchanged runs", ""]
    flagged_pairs, per_case, cases = 0, {}, 0
    for b, n in itertools.permutations(same, 2):
        slower, judged = _regressions(b, n, threshold, confidence)
        flagged_pairs += bool(slower)
        cases += judged
        for c in slower:
            per_case[c] = per_case.get(c, 0) + 1
    pairs = len(same) * (len(same) - 1)
    lines += [f"false alarms, run vs run (one-run baseline, judged over iterations): {flagged_pairs}/{pairs} ordered "
              "pairs flag anything "
              f"({flagged_pairs / max(pairs, 1):.1%}); {sum(per_case.values())}/{cases} timed case comparisons flagged "
              f"({sum(per_case.values()) / max(cases, 1):.2%})"]
    lines += [f"  {c}: {k}/{pairs}" for c, k in sorted(per_case.items(), key=lambda kv: -kv[1])]
    held, held_cases = 0, {}
    for i, n in enumerate(same):
        rest = _pooled(same[:i] + same[i + 1:])
        flagged, _ = _regressions(rest, n, threshold, confidence)
        held += bool(flagged)
        for c in flagged:
            held_cases[c] = held_cases.get(c, 0) + 1
    lines.append(f"false alarms, baseline merged from the other {len(same) - 1} runs (judged between runs) vs the "
                 f"held-out run: {held}/{len(same)} runs flag anything ({held / len(same):.0%})")
    lines += [f"  {c}: {k}/{len(same)}" for c, k in sorted(held_cases.items(), key=lambda kv: -kv[1])]
    triples = list(itertools.combinations(range(len(same)), NEW_RUNS))
    fa3 = sum(bool(_regressions(_pooled([r for i, r in enumerate(same) if i not in t]), _pooled([same[i] for i in t]),
                                threshold, confidence)[0]) for t in triples)
    lines.append(f"false alarms, {NEW_RUNS} new runs merged vs a baseline of the other {len(same) - NEW_RUNS}: "
                 f"{fa3}/{len(triples)} ({fa3 / max(len(triples), 1):.0%}) flag anything")
    merged = _pooled(same)
    for kind in [k for k in SLOWDOWNS if k != "same"]:
        slowed = _load(folder / kind) if (folder / kind).is_dir() else []
        if not slowed:
            continue
        single = [r for s in slowed for b in same for r in _times(b, s, threshold, confidence) if _timed_case(r)]
        vs_merged = [r for s in slowed for r in _times(merged, s, threshold, confidence)]
        cases_m = [r for r in vs_merged if _timed_case(r)]
        agg = [r for r in vs_merged if _aggregate(r)]
        multi = [r for t in itertools.combinations(range(len(slowed)), NEW_RUNS)
                 for r in _times(merged, _pooled([slowed[i] for i in t]), threshold, confidence)]
        ratios = sorted(r["ratio"] for r in cases_m)
        lines.append(f"power at {kind[4:]} % planted ({len(slowed)} runs; measured median ratio "
                     f"{ratios[len(ratios) // 2]:.2f}): cases flagged, single-run baseline "
                     f"{_share(single)}; baseline merged from {len(same)} runs {_share(cases_m)}; "
                     f"implementation aggregate {_share(agg)}; {NEW_RUNS} new runs merged: cases "
                     f"{_share([r for r in multi if _timed_case(r)])}, aggregate "
                     f"{_share([r for r in multi if _aggregate(r)])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from .cli import parse_threshold

    p = argparse.ArgumentParser(prog="python -m harness.gate.study", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", required=True)
    c.add_argument("--runs", type=int, default=10)
    c.add_argument("--power-runs", type=int, default=4)
    a = sub.add_parser("analyze")
    a.add_argument("folder")
    a.add_argument("--time-threshold", default="10%")
    a.add_argument("--confidence", type=float, default=0.99)
    args = p.parse_args(argv)
    if args.command == "collect":
        from harness.cli.parsing import output_path
        from harness.errors import UsageError

        try:  # before the runs' minutes
            output_path(args.out, "--out", folder=True)
        except UsageError as exc:
            print(f"paritybench: error: {exc}", file=sys.stderr)
            return 2
        collect(Path(args.out), args.runs, args.power_runs)
    else:
        print(analyze(Path(args.folder), parse_threshold(args.time_threshold), args.confidence))
    return 0


if __name__ == "__main__":
    sys.exit(main())
