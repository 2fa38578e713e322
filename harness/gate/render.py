"""The gate's output: text (a terminal), markdown (a pull-request comment) or JSON (tools)."""

from __future__ import annotations

import json
import math

ORDER = {True: 0, False: 1}


def _worst_first(records: list[dict]) -> list[dict]:
    """Regressions first, then by how far the ratio is from 1 (the largest change first)."""
    def badness(r):
        ratio = r.get("ratio")
        change = abs(math.log(ratio)) if ratio and math.isfinite(ratio) and ratio > 0 else 0.0
        return ORDER[r["regression"]], -change
    return sorted(records, key=badness)


def _interval(r: dict) -> str:
    if r.get("low") is None:
        return ""
    high = "inf" if math.isinf(r["high"]) else f"{r['high']:.3f}"
    return f"[{r['low']:.3f}, {high}]"


SINGLE_RUN = ("times judged over iterations: the baseline holds one run, so run-to-run variation is not "
              "measured and a noisy runner will cry wolf; merge several runs into the baseline (paritybench baseline)")


def summary(records: list[dict]) -> dict:
    regressions = [r for r in records if r["regression"]]
    times = [r for r in records if r["kind"] == "time"]
    methods = sorted({r["method"].split(" (")[0] for r in times if r.get("method")})
    return {"regressions": len(regressions), "judged": len(records), "time_methods": methods,
            "times": {v: sum(r["verdict"] == v for r in times) for v in sorted({r["verdict"] for r in times})}}


def _noteworthy(r: dict) -> bool:
    """Listed although not a regression: a change worth a look (never the harness's own dispatch overhead)."""
    return r["verdict"] in ("faster", "inconclusive", "smaller", "still failing", "new", "not judged") \
        and not r["detail"].startswith("harness overhead")


def _method_note(s: dict) -> list[str]:
    return [SINGLE_RUN] if "iterations" in s["time_methods"] else []


def text(header: dict, records: list[dict]) -> str:
    s = summary(records)
    lines = [f"paritybench compare {header['baseline']} -> {header['new']}",
             f"  threshold {header['threshold']:.1%}, confidence {header['confidence']:g}; "
             f"baseline: {header['baseline_runs']} run(s)"]
    lines += [f"  environment differs (allowed): {d}" for d in header["environment"]]
    lines += [f"  versions: {d}" for d in header["versions"]]
    lines += [f"  note: {n}" for n in _method_note(s)]
    for r in _worst_first(records):
        if r["regression"]:
            ratio = f" x{r['ratio']:.3f} {_interval(r)}" if r.get("ratio") is not None else ""
            lines.append(f"REGRESSION {r['kind']}: {r['case']}: {r['verdict']}{ratio}: {r['detail']}")
    changed = [r for r in _worst_first(records) if not r["regression"] and _noteworthy(r)]
    lines += [f"note {r['kind']}: {r['case']}: {r['verdict']} {_interval(r)} {r['detail']}".rstrip()
              for r in changed[:20]]
    if len(changed) > 20:
        lines.append(f"note: {len(changed) - 20} more (see --format json)")
    lines.append(totals(s))
    return "\n".join(lines)


def totals(s: dict) -> str:
    """The closing line of every format: regressions, items judged, time verdicts."""
    times = ", ".join(f"{n} {v}" for v, n in s["times"].items())
    return f"{s['regressions']} regression(s) in {s['judged']} judged item(s); times: {times or 'none'}."


def markdown_notes(header: dict, s: dict) -> list[str]:
    """Versions that differ, allowed environment differences, the one-run-baseline note: a bullet each."""
    notes = header["versions"] + [f"environment (allowed): {d}" for d in header["environment"]] + _method_note(s)
    return [f"- {d}" for d in notes] + [""] if notes else []


def markdown_table(records: list[dict], limit: int = 60) -> list[str]:
    """What changed, worst first: regressions, then the changes worth a look."""
    shown = [r for r in _worst_first(records) if r["regression"] or (_noteworthy(r) and r["verdict"] != "new")]
    if not shown:
        return []
    out = ["| verdict | kind | case | ratio | interval | detail |", "|---|---|---|---|---|---|"]
    for r in shown[:limit]:
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") is not None and math.isfinite(r["ratio"]) else ""
        mark = "**" if r["regression"] else ""
        out.append(f"| {mark}{r['verdict']}{mark} | {r['kind']} | `{r['case']}` | {ratio} | {_interval(r)} | "
                   f"{r['detail'].replace('|', '/')} |")
    if len(shown) > limit:
        out.append(f"\n_{len(shown) - limit} more rows: run `paritybench compare --format json`._")
    return out + [""]


def markdown(header: dict, records: list[dict]) -> str:
    s = summary(records)
    verdict = "❌ **regression**" if s["regressions"] else "✅ no regression"
    out = [f"### paritybench: {verdict}", "",
           f"`{header['new']}` against baseline `{header['baseline']}` ({header['baseline_runs']} run(s)); "
           f"time threshold {header['threshold']:.1%}, confidence {header['confidence']:g}.", ""]
    out += markdown_notes(header, s) + markdown_table(records) + [totals(s)]
    return "\n".join(out) + "\n"


def as_json(header: dict, records: list[dict]) -> str:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    rows = [{k: clean(v) for k, v in r.items()} for r in _worst_first(records)]
    return json.dumps({"header": header, "summary": summary(records), "records": rows}, indent=2)


FORMATS = {"text": text, "markdown": markdown, "json": as_json}
