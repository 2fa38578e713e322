"""``paritybench compare`` and ``paritybench baseline``: argument parsing and exit codes."""

from __future__ import annotations

import re
import sys

from . import baseline, judge, render
from .inputs import GateError, check_comparable, load, version_differences

EXIT_REGRESSION = 1


def add_parsers(sub) -> None:
    c = sub.add_parser("compare", help="regression verdicts of NEW against BASELINE (exit 1 on a regression)")
    c.add_argument("baseline", help="a run folder or a merged baseline (paritybench baseline)")
    c.add_argument("new", help="a run folder (or merged run) to judge")
    c.add_argument("--time-threshold", default="10%",
                   help="smallest slowdown that counts, as a percentage (default 10%%): a time is a regression "
                        "only when the whole confidence interval of new/baseline lies above 1 + this")
    c.add_argument("--confidence", type=float, default=0.99, help="confidence of the interval (default 0.99)")
    c.add_argument("--format", default="text", choices=sorted(render.FORMATS))
    c.add_argument("--output", default=None, help="also write the output to this file")
    c.add_argument("--allow-env-change", action="store_true",
                   help="compare runs from different backends, devices, world sizes or case settings")
    b = sub.add_parser("baseline", help="merge finished run folders into one (a baseline, or one CI run's parts)")
    b.add_argument("runs", nargs="+", metavar="RUN")
    b.add_argument("--out", required=True, help="the new folder, e.g. results/baselines/<name>/")
    b.add_argument("--allow-env-change", action="store_true", help="merge runs from different environments")


def parse_threshold(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", text)
    if not m or not 0 < float(m.group(1)) < 1000:
        raise GateError(f"--time-threshold {text!r} must be a percentage above 0, such as 10%.")
    return float(m.group(1)) / 100


def compare_paths(base_path: str, new_path: str, threshold: float, confidence: float,
                  allow_env_change: bool = False) -> tuple[dict, list[dict]]:
    """(header, verdict records) of NEW against BASELINE; ``GateError`` for bad input."""
    if not 0.5 <= confidence < 1:
        raise GateError(f"--confidence {confidence!r} must be at least 0.5 and below 1, such as 0.99.")
    base, new = load(base_path), load(new_path)
    env = check_comparable(base, new, allow_env_change)
    records = judge.compare(base, new, threshold, confidence)
    if not any(r["verdict"] not in ("missing", "new") for r in records):
        raise GateError(f"{base_path!r} and {new_path!r} have no case in common: nothing to compare (were they "
                        "made by the same sweep?).")
    header = {"baseline": base_path, "new": new_path, "threshold": threshold, "confidence": confidence,
              "baseline_runs": base.runs, "environment": env, "versions": version_differences(base, new)}
    return header, records


def run_compare(args) -> int:
    from harness.cli.parsing import output_path

    if args.output:
        output_path(args.output, "--output")
    header, records = compare_paths(args.baseline, args.new, parse_threshold(args.time_threshold), args.confidence,
                                    args.allow_env_change)
    text = render.FORMATS[args.format](header, records)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + ("" if text.endswith("\n") else "\n"))
    return EXIT_REGRESSION if any(r["regression"] for r in records) else 0


def run_baseline(args) -> int:
    from harness.cli.parsing import output_path

    output_path(args.out, "--out", folder=True)
    path = baseline.merge(args.runs, args.out, args.allow_env_change)
    print(path)
    print(f"paritybench: merged {len(args.runs)} run(s) into {path}", file=sys.stderr)
    return 0
