"""Report sections: the calibration fits (α–β per collective, point-to-point, compute rates; fit vs
measurement plot) and the planner's predictions beside the measurements (3D step times, pipeline bubble:
table, scatter, Spearman rank correlation, median |error|, and the targets)."""

from __future__ import annotations

from pathlib import Path

TARGETS = {"spearman": 0.8, "median_error": 0.25, "top1_gap": 0.10, "bubble_rel": 0.15, "kendall_resolved": 0.8}
"""Fixed before any measurement (docs/guides/planner.md): never tuned to a run."""


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties): Pearson's of the ranks."""
    return float(a.rank().corr(b.rank()))


def planner_summary(rows) -> dict:
    """Over rows with a measured and a planned time: Spearman, median |error|, and how far the layout the
    plan ranks first is from the measured best (its measured time / the best measured time - 1)."""
    ok = rows.dropna(subset=["time_p50_us", "time_planned_us"])
    if len(ok) < 2:
        return {}
    err = (ok["time_planned_us"] - ok["time_p50_us"]).abs() / ok["time_p50_us"]
    first = ok.loc[ok["time_planned_us"].idxmin()]
    return {"n": len(ok), "spearman": spearman(ok["time_p50_us"], ok["time_planned_us"]),
            "median_error": float(err.median()), "max_error": float(err.max()),
            "planned_first": first["op"], "top1_gap": float(first["time_p50_us"] / ok["time_p50_us"].min() - 1),
            "measured_best": ok.loc[ok["time_p50_us"].idxmin(), "op"]}


def resolved_summary(rows) -> dict:
    """What the measurement can judge of the plan: rows with a planned time and a measured median with its
    confidence interval (``time_ci_lo_us`` .. ``time_ci_hi_us``). A pair of layouts is *resolved* when their
    intervals do not overlap; it is concordant when the plan orders it as the medians do, discordant when
    the other way (a planned tie: neither). Kendall's tau over resolved pairs = (C - D) / (C + D). The
    layouts *tied for best*: the best median's and every layout whose interval overlaps the best's — the
    plan's first is judged against that set, not against one noisy minimum."""
    cols = ["time_p50_us", "time_planned_us", "time_ci_lo_us", "time_ci_hi_us"]
    if not set(cols) <= set(rows.columns):
        return {}
    ok = rows.dropna(subset=cols)
    if len(ok) < 2:
        return {}
    recs = ok[["op", *cols]].to_dict("records")
    concordant = discordant = unresolved = 0
    for i, a in enumerate(recs):
        for b in recs[i + 1:]:
            if a["time_ci_hi_us"] >= b["time_ci_lo_us"] and b["time_ci_hi_us"] >= a["time_ci_lo_us"]:
                unresolved += 1
                continue
            sign = (a["time_p50_us"] - b["time_p50_us"]) * (a["time_planned_us"] - b["time_planned_us"])
            concordant, discordant = concordant + (sign > 0), discordant + (sign < 0)
    best = min(recs, key=lambda r: r["time_p50_us"])
    tied = [r["op"] for r in recs if r["time_ci_lo_us"] <= best["time_ci_hi_us"]]
    first = min(recs, key=lambda r: r["time_planned_us"])
    return {"pairs": len(recs) * (len(recs) - 1) // 2, "concordant": concordant, "discordant": discordant,
            "unresolved": unresolved,
            "kendall": (concordant - discordant) / (concordant + discordant) if concordant + discordant else None,
            "tied_for_best": tied, "planned_first": first["op"], "first_tied": first["op"] in tied,
            "level": float(ok["time_ci_level"].min()) if "time_ci_level" in ok else None}


def _resolved_lines(r: dict) -> list[str]:
    if not r:
        return []
    level = f" at {r['level']:.0%} confidence" if r.get("level") is not None else ""
    lines = [f"- what this measurement resolves: {r['concordant'] + r['discordant']} of {r['pairs']} layout pairs "
             f"have measured intervals{level} that do not overlap; {r['unresolved']} are unresolved (this machine "
             "cannot order them, so no ranking statistic can judge the plan on them)"]
    if r["kendall"] is None:
        lines.append("- Kendall's tau over resolved pairs: none resolved — not judged")
    else:
        lines.append(f"- over the resolved pairs the plan orders {r['concordant']} as measured and {r['discordant']} "
                     f"the other way: Kendall's tau {r['kendall']:.2f} (target ≥ {TARGETS['kendall_resolved']}: "
                     f"{_verdict(r['kendall'] >= TARGETS['kendall_resolved'])})")
    lines.append(f"- tied for best (interval overlapping the best median's): {', '.join(r['tied_for_best'])}; "
                 f"ranked first by the plan: {r['planned_first']} — "
                 + ("among them (met)" if r["first_tied"] else "not among them (**not met**)"))
    return lines


def bubble_judgement(row: dict) -> str:
    """A planned bubble is "within" 15 % of the measured median, "unresolved" when outside that but inside
    the measured step-to-step interval (the run cannot tell it wrong), else "missed"."""
    planned, measured = row["bubble_planned"], row["bubble_measured"]
    if abs(planned - measured) <= TARGETS["bubble_rel"] * abs(measured):
        return "within"
    lo, hi = row.get("bubble_ci_lo"), row.get("bubble_ci_hi")
    if lo is not None and hi is not None and lo == lo and hi == hi and lo <= planned <= hi:
        return "unresolved"
    return "missed"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def planner_section(bench, run_dir, md) -> list[str]:
    planned = bench[bench["time_planned_us"].notna()]
    threed = planned[planned["suite"] == "3d"].copy()
    pipe = planned[planned["suite"] == "pipeline"].copy()
    stacks = planned[planned["suite"] == "stack"]
    groups = [("3D layouts (dp x pp x tp)", threed)] if len(threed) else []
    for (impl, family), rows in stacks.groupby([stacks["impl"], stacks["op"].str.split("/").str[0]], sort=False):
        groups.append((f"Stack {impl}, {family} (dp x pp x tp)", rows.copy()))
    if not groups and not len(pipe):
        return []
    out = ["## Planner: predicted vs measured", "",
           "Predicted from this run's machine profile (`profile.json`, fitted from `calibration.csv`; "
           "`paritybench calibrate`): compute at the measured FLOP/s plus each layer's measured overhead, TP, DP "
           "and PP communication with the fitted α and β, and the schedule simulated with those costs. Parts "
           "(ms) are the busiest rank's and add up to the planned step.", ""]
    for title, rows in groups:
        out += _layouts_block(title, rows, md)
    bub = pipe.dropna(subset=["bubble_measured", "bubble_planned"]).copy()
    if len(pipe):
        pipe["measured_ms"], pipe["planned_ms"] = pipe["time_p50_us"] / 1e3, pipe["time_planned_us"] / 1e3
        pipe["error"] = pipe["planned_ms"] / pipe["measured_ms"] - 1
        out += ["### Pipeline schedules: step time", "",
                md(pipe[["impl", "world_size", "op", "microbatches", "measured_ms", "planned_ms", "error"]], ".3g",
                   index=False), ""]
    if len(bub):
        bub["relative_error"] = (bub["bubble_planned"] - bub["bubble_measured"]) / bub["bubble_measured"]
        bub["judged"] = [bubble_judgement(r) for r in bub.to_dict("records")]
        within, spread = (bub["judged"] == "within").sum(), (bub["judged"] == "unresolved").sum()
        cols = ["world_size", "op", "microbatches", "bubble_measured", "bubble_planned", "bubble_predicted",
                "bubble_simulated", "relative_error", "judged"]
        if "bubble_ci_lo" in bub:
            cols[4:4] = ["bubble_ci_lo", "bubble_ci_hi"]
        out += ["### Pipeline bubble: planned (from the profile) vs measured (the runtime's timestamps)", "",
                md(bub[cols], ".3f", index=False), "",
                f"{within} of {len(bub)} within {TARGETS['bubble_rel']:.0%} of the measured bubble; {spread} outside "
                "it but inside the measured step-to-step interval (`bubble_ci_lo` .. `bubble_ci_hi`: unresolved — this "
                f"run cannot tell them wrong); {len(bub) - within - spread} missed (target: none missed; "
                f"{_verdict(within + spread == len(bub))}). `bubble_predicted`: the schedule simulated with this "
                "run's own measured per-action costs; `bubble_simulated`: at unit costs.", ""]
    import pandas as pd

    layouts = pd.concat([rows for _, rows in groups]) if groups else threed
    if _scatter(layouts, pipe, Path(run_dir) / "planner.png"):
        out += ["![predicted vs measured](planner.png)", ""]
    return out


def _layouts_block(title: str, rows, md) -> list[str]:
    """One set of layouts (the 3D bench's, or one stack's and family's): the table, what the measurement
    resolves, the targets."""
    s = planner_summary(rows)
    rows["measured_ms"], rows["planned_ms"] = rows["time_p50_us"] / 1e3, rows["time_planned_us"] / 1e3
    rows["error"] = rows["planned_ms"] / rows["measured_ms"] - 1
    rows["rank_measured"] = rows["measured_ms"].rank(method="min").astype(int)
    rows["rank_planned"] = rows["planned_ms"].rank(method="min").astype(int)
    for part in ("compute", "tp", "pp", "bubble", "dp", "sync"):
        rows[part] = rows[f"plan_{part}_us"] / 1e3
    cols = ["op", "measured_ms", "planned_ms", "error", "rank_measured", "rank_planned", "compute", "tp", "pp",
            "bubble", "dp", "sync", "bubble_measured", "bubble_planned"]
    resolved = resolved_summary(rows)
    if resolved:
        rows["interval_ms"] = [f"[{lo / 1e3:.3g}, {hi / 1e3:.3g}]" for lo, hi in
                               zip(rows["time_ci_lo_us"], rows["time_ci_hi_us"], strict=True)]
        cols.insert(2, "interval_ms")
    out = [f"### {title}", "", md(rows.sort_values("rank_measured")[cols], ".3g", index=False), ""]
    out += _resolved_lines(resolved)
    if s:
        t = TARGETS
        out += [f"- Spearman rank correlation {s['spearman']:.2f} over {s['n']} layouts "
                f"(target ≥ {t['spearman']}: {_verdict(s['spearman'] >= t['spearman'])})",
                f"- median |error| {s['median_error']:.0%}, largest {s['max_error']:.0%} "
                f"(target ≤ {t['median_error']:.0%}: {_verdict(s['median_error'] <= t['median_error'])})",
                f"- ranked first by the plan: {s['planned_first']}, measured {s['top1_gap']:.0%} above the "
                f"measured best ({s['measured_best']}) "
                f"(target ≤ {t['top1_gap']:.0%}: {_verdict(s['top1_gap'] <= t['top1_gap'])})",
                "- (Spearman, |error| and the gap read every median as exact; the lines above say which of their "
                "differences the measurement resolves)", ""]
    return out


def _scatter(threed, pipe, path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    lo, hi = float("inf"), 0.0
    for label, rows in (("layouts", threed), ("pipeline", pipe)):
        if len(rows):
            x, y = rows["time_p50_us"] / 1e3, rows["time_planned_us"] / 1e3
            ax.scatter(x, y, s=14, label=label)
            lo, hi = min(lo, x.min(), y.min()), max(hi, x.max(), y.max())
            if label == "layouts":
                for _, r in rows.iterrows():
                    ax.annotate(r["op"], (r["time_p50_us"] / 1e3, r["time_planned_us"] / 1e3), fontsize=6)
    ax.plot([lo, hi], [lo, hi], ls="--", lw=0.8, color="grey", label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlabel="measured step (ms, p50)", ylabel="predicted step (ms)",
           title="planner: predicted vs measured")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def calibration_section(calibration, meta, run_dir, md) -> list[str]:
    """The fits of this run's calibration rows, with their error, and a plot of fit vs measurement."""
    from harness.cost_model.build import host_of, profile_from_frames
    from harness.cost_model.profile import ProfileError

    if not len(calibration):
        return []
    try:
        prof = profile_from_frames(calibration, None, meta.get("backend") or "gloo", host_of(meta), str(run_dir))
    except ProfileError as exc:
        return ["## Calibration", "", f"_(no profile: {exc})_", ""]
    import pandas as pd

    fits = pd.DataFrame([{"what": e.get("op") or f"p2p {e['what']}", "world": e["world_size"],
                          "group": e.get("group_size", 2), "alpha_us": e["alpha_s"] * 1e6,
                          "GB/s": 1 / e["beta_s_per_byte"] / 1e9 if e["beta_s_per_byte"] > 0 else float("inf"),
                          "median_err": e["median_rel_error"], "max_err": e["max_rel_error"]}
                         for e in prof.collectives + prof.p2p])
    rates = pd.DataFrame([{"world": e["world_size"], "dtype": e["dtype"], "kind": e["kind"],
                           "GFLOP/s": e["flops_per_s"] / 1e9, "overhead_ms": e.get("overhead_s", 0.0) * 1e3}
                          for e in prof.compute])
    out = ["## Calibration: the machine profile", "",
           "α–β fits (ring model: steps α + bytes β; point-to-point: α + S β) of the calibration sweep, every rank of "
           "the world busy at once; errors relative, over the sizes timed. Compute: per-rank FLOP/s, and per layer "
           "the time beyond its GEMMs (what tensor parallelism does not divide).", "",
           md(fits, ".3g", index=False), "", md(rates, ".3g", index=False), ""]
    if _plot_fits(calibration, prof, Path(run_dir) / "calibration.png"):
        out += ["![calibration fits](calibration.png)", ""]
    return out


def _plot_fits(calibration, prof, path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.cost_model.fit import collective_terms

    worlds = prof.world_sizes
    fig, axes = plt.subplots(1, len(worlds), figsize=(5 * len(worlds), 4), squeeze=False)
    for ax, n in zip(axes[0], worlds, strict=True):
        for e in [e for e in prof.collectives if e["world_size"] == n]:
            pts = calibration[(calibration["kind"] == "collective") & (calibration["op"] == e["op"])
                              & (calibration["world_size"] == n) & (calibration["group_size"] == e["group_size"])]
            pts = pts.sort_values("bytes")
            line = ax.plot(pts["bytes"], pts["time_p50_us"], "o", ms=3, label=f"{e['op']} g={e['group_size']}")[0]
            fitted = [sum(a * b for a, b in zip(collective_terms(e["op"], e["group_size"], s),
                                                 (e["alpha_s"], e["beta_s_per_byte"]), strict=True)) * 1e6
                      for s in pts["bytes"]]
            ax.plot(pts["bytes"], fitted, "-", lw=0.8, color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="bytes", ylabel="time (µs, p50)",
               title=f"world {n}: measured (dots) vs α–β fit (lines)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
