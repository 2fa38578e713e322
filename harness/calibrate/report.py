"""Report sections: the calibration fits (α–β per collective, point-to-point, compute rates; fit vs
measurement plot) and the planner's predictions beside the measurements (3D step times, pipeline bubble:
table, scatter, Spearman rank correlation, median |error|, and the targets)."""

from __future__ import annotations

from pathlib import Path

TARGETS = {"spearman": 0.8, "median_error": 0.25, "top1_gap": 0.10, "bubble_rel": 0.15}


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


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def planner_section(bench, run_dir, md) -> list[str]:
    threed = bench[(bench["suite"] == "3d") & bench["time_planned_us"].notna()].copy()
    pipe = bench[(bench["suite"] == "pipeline") & bench["time_planned_us"].notna()].copy()
    if not len(threed) and not len(pipe):
        return []
    out = ["## Planner: predicted vs measured", "",
           "Predicted from this run's machine profile (`profile.json`, fitted from `calibration.csv`; "
           "`paritybench calibrate`): compute at the measured FLOP/s plus each layer's measured overhead, TP, DP "
           "and PP communication with the fitted α and β, and the schedule simulated with those costs. Parts "
           "(ms) are the busiest rank's and add up to the planned step.", ""]
    if len(threed):
        s = planner_summary(threed)
        threed["measured_ms"], threed["planned_ms"] = threed["time_p50_us"] / 1e3, threed["time_planned_us"] / 1e3
        threed["error"] = threed["planned_ms"] / threed["measured_ms"] - 1
        threed["rank_measured"] = threed["measured_ms"].rank(method="min").astype(int)
        threed["rank_planned"] = threed["planned_ms"].rank(method="min").astype(int)
        for part in ("compute", "tp", "pp", "bubble", "dp", "sync"):
            threed[part] = threed[f"plan_{part}_us"] / 1e3
        cols = ["op", "measured_ms", "planned_ms", "error", "rank_measured", "rank_planned", "compute", "tp", "pp",
                "bubble", "dp", "sync", "bubble_measured", "bubble_planned"]
        out += ["### 3D layouts (dp x pp x tp)", "", md(threed.sort_values("rank_measured")[cols], ".3g", index=False),
                ""]
        if s:
            t = TARGETS
            out += [f"- Spearman rank correlation {s['spearman']:.2f} over {s['n']} layouts "
                    f"(target ≥ {t['spearman']}: {_verdict(s['spearman'] >= t['spearman'])})",
                    f"- median |error| {s['median_error']:.0%}, largest {s['max_error']:.0%} "
                    f"(target ≤ {t['median_error']:.0%}: {_verdict(s['median_error'] <= t['median_error'])})",
                    f"- ranked first by the plan: {s['planned_first']}, measured {s['top1_gap']:.0%} above the "
                    f"measured best ({s['measured_best']}) "
                    f"(target ≤ {t['top1_gap']:.0%}: {_verdict(s['top1_gap'] <= t['top1_gap'])})", ""]
    bub = pipe.dropna(subset=["bubble_measured", "bubble_planned"]).copy()
    if len(pipe):
        pipe["measured_ms"], pipe["planned_ms"] = pipe["time_p50_us"] / 1e3, pipe["time_planned_us"] / 1e3
        pipe["error"] = pipe["planned_ms"] / pipe["measured_ms"] - 1
        out += ["### Pipeline schedules: step time", "",
                md(pipe[["impl", "world_size", "op", "microbatches", "measured_ms", "planned_ms", "error"]], ".3g",
                   index=False), ""]
    if len(bub):
        bub["relative_error"] = (bub["bubble_planned"] - bub["bubble_measured"]) / bub["bubble_measured"]
        within = (bub["relative_error"].abs() <= TARGETS["bubble_rel"]).sum()
        out += ["### Pipeline bubble: planned (from the profile) vs measured (the runtime's timestamps)", "",
                md(bub[["world_size", "op", "microbatches", "bubble_measured", "bubble_planned", "bubble_predicted",
                        "bubble_simulated", "relative_error"]], ".3f", index=False), "",
                f"{within} of {len(bub)} within {TARGETS['bubble_rel']:.0%} of the measured bubble (target: all; "
                f"{_verdict(within == len(bub))}). `bubble_predicted`: the schedule simulated with this run's own "
                "measured per-action costs; `bubble_simulated`: at unit costs.", ""]
    if _scatter(threed, pipe, Path(run_dir) / "planner.png"):
        out += ["![predicted vs measured](planner.png)", ""]
    return out


def _scatter(threed, pipe, path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    lo, hi = float("inf"), 0.0
    for label, rows in (("3d layouts", threed), ("pipeline", pipe)):
        if len(rows):
            x, y = rows["time_p50_us"] / 1e3, rows["time_planned_us"] / 1e3
            ax.scatter(x, y, s=14, label=label)
            lo, hi = min(lo, x.min(), y.min()), max(hi, x.max(), y.max())
            if label == "3d layouts":
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
    from .build import host_of, profile_from_frames
    from .profile import ProfileError

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

    from .fit import collective_terms

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
