"""The first screen of ``report.md``: what a reader opens it to learn, each line linking its section.

Did every implementation and stack hold to one device (the conformance counts, every FAIL and finding with its
one-line cause), the headline ratios (reference vs native collectives, each stack beside ours, the planner's
Kendall tau over resolved pairs, the pipeline bubble), what the run could not judge, and where its time went.
Everything is read from the run's CSV / JSON and from the sections already written (a line links only a section
the report has)."""

from __future__ import annotations

import re
from collections import Counter

_LISTED = 8  # FAIL / finding lines named one by one before "and N more"


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def first_line(text) -> str:
    text = "" if text is None or text != text else str(text)
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 200 else line[:197] + "..."


def summary(meta: dict, bench, conf, sections: list[str]) -> list[str]:
    """The summary's markdown lines; ``sections`` are the report's lines already written (for the links)."""
    headings = {line.lstrip("#").strip(): anchor(line) for line in sections if line.startswith("#")}

    def link(text: str, heading: str) -> str:
        """``text`` linking the first section whose heading starts with ``heading`` (plain where there is none)."""
        found = next((a for h, a in headings.items() if h.startswith(heading)), None)
        return f"[{text}](#{found})" if found else text

    out = ["## Summary", ""]
    out += _conformance(conf, link)
    out += _listed(bench, "wrong", "Wrong results", "benchmark rows that ran but whose result is not one device's "
                   "(a wrong element, or the suite's verdict)", link)
    out += _listed(bench, "failed", "Failed cases", "benchmark rows in which an implementation raised, a rank died or "
                   "the call hung", link)
    out += _headlines(bench, link)
    out += _not_judged(bench, conf, link)
    out += _time(meta, link)
    return out + [""]


def _case(row) -> str:
    parts = [str(row.get(k)) for k in ("property", "collective", "op") if row.get(k) == row.get(k) and row.get(k)]
    size = f" n={int(row['world_size'])}" if row.get("world_size") == row.get("world_size") else ""
    return " ".join(dict.fromkeys(parts)) + size


def _conformance(conf, link) -> list[str]:
    if not len(conf):
        return ["- **Conformance**: no conformance rows in this run."]
    counts = conf["outcome"].value_counts()
    said = ", ".join(f"{int(counts[k])} {k}" for k in ("pass", "fail", "known-nonconformance", "unsupported",
                                                        "refused", "error") if k in counts)
    impls = sorted(conf["impl"].dropna().astype(str).unique())
    verdict = "every row held" if not counts.get("fail", 0) and not counts.get("error", 0) else "**not all held**"
    out = [f"- **Conformance** ({link('matrix', 'Stacks held to one device: the conformance matrix')}, "
           f"{link('rows', 'Conformance rows')}): {len(conf)} rows over {len(impls)} implementations — {said}: "
           f"{verdict}."]
    for outcome, label in (("fail", "FAIL"), ("error", "ERROR"), ("known-nonconformance", "finding")):
        rows = conf[conf["outcome"] == outcome]
        groups = rows.groupby(["impl", rows["detail"].map(first_line)], sort=False)
        for i, ((impl, detail), g) in enumerate(groups):
            if i == _LISTED:
                out.append(f"  - … and {groups.ngroups - _LISTED} more {label} causes (the sections below).")
                break
            out.append(f"  - {label} `{impl}` — {_case(g.iloc[0])}{f' (+{len(g) - 1} rows)' if len(g) > 1 else ''}: "
                       f"{detail or '(no detail)'}")
    return out


def _listed(bench, status: str, heading: str, what: str, link) -> list[str]:
    """The benchmark rows of ``status`` (``wrong``, ``failed``), by suite, implementation and cause."""
    rows = bench[bench["status"] == status] if len(bench) else bench
    if not len(rows):
        return []
    groups = rows.groupby(["suite", "impl", rows["detail"].map(first_line)], sort=False)
    out = [f"- **{heading}** ({link('table', heading)}): {len(rows)} {what}:"]
    for i, ((suite, impl, detail), g) in enumerate(groups):
        if i == _LISTED:
            out.append(f"  - … and {groups.ngroups - _LISTED} more causes (the table).")
            break
        out.append(f"  - {suite} `{impl}` ({len(g)}): {detail or '(no detail)'}")
    return out


def _headlines(bench, link) -> list[str]:
    """Each paradigm's headline lines (its record's ``headlines``), then the planner's."""
    if not len(bench):
        return []
    from harness.paradigm import load, paradigms

    out = [line for p in paradigms() if p.headlines for line in load(p.headlines)(bench, link)]
    out += _planner(bench, link)
    return out


def _planner(bench, link) -> list[str]:
    from harness.cost_model.report import TARGETS, bubble_judgement, resolved_summary

    planned = bench[bench["time_planned_us"].notna()]
    stacks = planned[planned["suite"] == "stack"]
    parts = []
    for (impl, family), rows in stacks.groupby([stacks["impl"], stacks["op"].str.split("/").str[0]], sort=False):
        r = resolved_summary(rows)
        if r:
            tau = "none resolved" if r["kendall"] is None else f"tau {r['kendall']:.2f}"
            parts.append(f"{impl} {family} {tau} ({r['concordant']} as measured, {r['discordant']} not, of "
                         f"{r['pairs']} pairs)")
    out = []
    if parts:
        out.append(f"- **Planner** ({link('predicted vs measured', 'Planner: predicted vs measured')}; Kendall's "
                   f"tau over resolved layout pairs, target ≥ {TARGETS['kendall_resolved']}): {'; '.join(parts)}.")
    bub = planned[planned["suite"] == "pipeline"].dropna(subset=["bubble_measured", "bubble_planned"])
    if len(bub):
        judged = [bubble_judgement(r) for r in bub.to_dict("records")]
        out.append(f"- **Pipeline bubble** ({link('planned vs measured', 'Pipeline bubble')}"
                   f"): {judged.count('within')} of {len(judged)} within {TARGETS['bubble_rel']:.0%} of the measured "
                   f"bubble, {judged.count('unresolved')} unresolved, {judged.count('missed')} missed.")
    return out


def _not_judged(bench, conf, link) -> list[str]:
    rows = []
    if len(bench):
        b = bench[bench["status"] == "unsupported"]
        rows += [(r["suite"], r["impl"], first_line(r["detail"])) for r in b.to_dict("records")]
    if len(conf):
        c = conf[conf["outcome"].isin(["unsupported", "refused"])]
        rows += [(r["suite"], r["impl"], first_line(r["detail"])) for r in c.to_dict("records")]
    if not rows:
        return ["- **Not judged**: nothing — every case this run asked for ran."]
    by = Counter(rows)
    out = [f"- **Not judged** ({len(rows)} rows; each implementation's own sentence):"]
    for i, ((suite, impl, why), k) in enumerate(by.most_common()):
        if i == _LISTED:
            out.append(f"  - … and {len(by) - _LISTED} more reasons (the sections below).")
            break
        out.append(f"  - {suite} `{impl}` ({k}): {why}")
    return out


def _time(meta: dict, link) -> list[str]:
    sections = meta.get("sections") or []
    if not sections:
        return []
    total = sum(s["seconds"] for s in sections)
    longest = max(sections, key=lambda s: s["seconds"])
    return [f"- **Time** ({link('per section', 'Time per section')}): {total / 60:.1f} min of sections; the longest "
            f"{longest['section']} {longest['seconds']:.0f} s."]
