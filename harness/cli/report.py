"""``paritybench report RUN_DIR``: report.md (pandas tables) and PNG plots, from CSV/JSON only."""

from __future__ import annotations

from pathlib import Path

from harness.paradigm import Section, load, sections
from harness.records.results import read_run


def _md(df, floatfmt=".3f", index=True) -> str:
    return df.to_markdown(floatfmt=floatfmt, index=index) if len(df) else "_(no rows)_"


def _sections_table(meta: dict) -> list[str]:
    """Wall time per section of the run (``harness.cli.bench.run_plans``: each sweep, its World start-up included)."""
    import pandas as pd

    sections = meta.get("sections") or []
    if not sections:
        return []
    frame = pd.DataFrame(sections)
    frame = frame.groupby("section", sort=False)["seconds"].sum().to_frame()  # bench all's stack runs once a stack
    total = float(frame["seconds"].sum())
    frame["share"] = frame["seconds"] / total
    stopped = [f"- **{s['stopped']}**" for s in sections if s.get("stopped")]  # harness.cli.bench.run_plans
    return ["## Time per section", "", f"Wall seconds of each section of this run, {total:.0f} s in all "
            "(the report itself is timed after it: `report_seconds` in run.json).", "", _md(frame, ".3g"), "",
            *([f"Stopped by a rank's exception ({len(stopped)}; the rows before it kept):", "", *stopped, ""]
              if stopped else [])]


def _where(meta: dict) -> list[str]:
    env = {k: meta.get(k) for k in ("command", "started", "finished", "backend", "python", "torch",
                                    "cpu", "cpu_count", "gpus", "host", "git_revision", "launcher", "nodes")
           if meta.get(k)}
    out = ["## Where it ran", "", *[f"- **{k}**: `{v}`" for k, v in env.items()]]
    for size, info in sorted(meta.get("placement", {}).items(), key=lambda kv: int(kv[0])):
        if not info.get("ranks"):
            continue
        per_host = {}
        for r in info["ranks"]:
            per_host.setdefault((r["node"], r["host"]), []).append(str(r["rank"]))
        hosts = "; ".join(f"node {node} `{host}`: ranks {','.join(ranks)}" for (node, host), ranks in per_host.items())
        out.append(f"- **world {size}**: {hosts} ({info['ranks'][0]['device'].split(':')[0]})")
    return out + [""]


def dispatch_section(dispatch, run_dir, md) -> list[str]:
    return ["## World dispatch overhead (warm no-op `World.run`, µs)", "",
            md(dispatch.astype({"iters": str}).set_index("world_size")[
                ["iters", "time_p50_us", "time_p95_us", "time_min_us", "time_max_us", "time_cv"]], ".2f"), ""]


def conformance_counts(conf, run_dir, md) -> list[str]:
    from harness.localise.saved import section

    counts = conf.groupby(["impl", "outcome"]).size().unstack(fill_value=0)
    return ["## Conformance rows", "", md(counts, "g"), ""] + section(run_dir)


def calibration(rows, run_dir, md) -> list[str]:
    """The calibration fits, with the backend and host of the run (its run.json)."""
    import json

    from harness.cost_model.report import calibration_section

    return calibration_section(rows, json.loads((Path(run_dir) / "run.json").read_text()), run_dir, md)


def _cases(rows, status: str):
    """The benchmark rows of ``status``, each named by its case's own keys, its detail's first line."""
    from harness.cli.summary import first_line

    chosen = rows[rows["status"] == status].copy()
    chosen["detail"] = chosen["detail"].map(first_line)
    shown = [c for c in ("suite", "impl", "op", "world_size", "bytes", "microbatches", "detail")
             if c in chosen.columns and (c == "detail" or chosen[c].notna().any())]
    return chosen[shown]


def failed_cases(rows, run_dir, md) -> list[str]:
    """Every benchmark case an implementation raised, died or hung in (``harness.runtime.bench_case``), with its
    verdict line; nothing where there are none."""
    failed = _cases(rows, "failed")
    if not len(failed):
        return []
    return ["## Failed cases", "", "Benchmark cases in which an implementation raised, a rank died or the call hung "
            "(status `failed`, no timing; the sweep went on with its next case): the failing rank's own failure "
            "first. Each section's tables leave them out.", "", md(failed, "g", index=False), ""]


def wrong_results(rows, run_dir, md) -> list[str]:
    """Every benchmark case that ran but whose check failed (status ``wrong``), over every suite; nothing where there
    are none."""
    wrong = _cases(rows, "wrong")
    if not len(wrong):
        return []
    return ["## Wrong results", "", "Benchmark cases that ran and were timed but whose result is not one device's "
            "(status `wrong`): wrong elements in the exact check beside the timing (collectives), or the suite's "
            "verdict of the same case at its own size (Muon, low precision) — a registered finding named first, "
            "\"known finding: ...\". Each section's tables show them beside the ok rows.", "",
            md(wrong, "g", index=False), ""]


# The report's own sections among the paradigms' (harness.paradigm.Section: its ``order`` places it)
HOUSE = (Section(10, "harness.cli.report:dispatch_section", suite="world"),
         Section(900, "harness.cost_model.report:planner_section"),
         Section(910, "harness.cli.report:calibration", source="calibration.csv"),
         Section(920, "harness.records.scaling:scaling_section"),
         Section(975, "harness.cli.report:wrong_results"),
         Section(980, "harness.cli.report:failed_cases"),
         Section(990, "harness.cli.report:conformance_counts", source="conformance.csv"))


def _sections(frames: dict, run_dir: Path) -> list[str]:
    out = []
    for section in sorted((*HOUSE, *sections()), key=lambda s: s.order):
        frame = frames[section.source]
        rows = frame[frame["suite"] == section.suite] if section.suite and len(frame) else frame
        if len(rows):
            out += load(section.function)(rows, run_dir, _md)
    return out


def write_report(run_dir, baseline=None) -> Path:
    """Write ``report.md`` (and each section's plots, ``scaling.csv``) into the run folder; return its path.
    With ``baseline`` (a run folder or merged baseline) the report opens with the gate's comparison."""
    run_dir = Path(run_dir)
    meta, frames = read_run(run_dir)
    out = [f"# paritybench report — run {meta.get('run_id')}", ""]
    if meta.get("status") != "complete":
        out += [f"> **This run is {meta.get('status', 'unknown')}**: it stopped before the end; "
                "the tables show the rows it finished.", ""]
    if baseline is not None:
        from harness.gate.report import comparison_section

        out += comparison_section(str(baseline), run_dir)
    out += _where(meta)
    out += _sections_table(meta)
    out += _sections(frames, run_dir)
    from harness.cli.summary import summary as first_screen

    head = 3 if meta.get("status") != "complete" else 1  # the title, and the incomplete-run warning
    out[head + 1:head + 1] = first_screen(meta, frames["benchmarks.csv"], frames["conformance.csv"], out)
    path = run_dir / "report.md"
    path.write_text("\n".join(out))
    return path
