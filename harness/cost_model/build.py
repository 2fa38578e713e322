"""A profile from a run folder's measurements: ``paritybench calibrate --from RUN_DIR``.

Reads calibration.csv (the calibration sweep's rows) and, where present, the collectives benchmark's
rows of benchmarks.csv (whole-world collectives: group size = world size, the busiest op per size), fits
each (op, world size, group size) with ``fit``, and records the host from run.json.
"""

from __future__ import annotations

from pathlib import Path

from harness.cost_model.fit import fit_collective, fit_message
from harness.cost_model.profile import Profile, ProfileError

NEEDS = "run 'paritybench calibrate --out PROFILE.json' (or 'paritybench bench all', which calibrates first)"


def host_of(meta: dict) -> dict:
    gpus = meta.get("gpus") or []
    return {"cpu": meta.get("cpu"), "cores": meta.get("cpu_count"), "device": gpus[0] if gpus else "cpu",
            "torch": meta.get("torch"), "hostname": meta.get("host")}


def _points(frame) -> list[dict]:
    return [r for r in frame.to_dict("records") if r.get("time_p50_us") == r.get("time_p50_us")
            and (r.get("time_p50_us") or 0) > 0]


def profile_from_frames(calibration, collectives, backend: str, host: dict, source: str) -> Profile:
    """Fit every group of points; ``collectives`` may be None or empty (the sweep alone suffices)."""
    import pandas as pd

    prof = Profile(backend=backend, host=host, source=source)
    coll = calibration[calibration["kind"] == "collective"][["op", "world_size", "group_size", "bytes",
                                                            "time_p50_us"]]
    if collectives is not None and len(collectives):
        ok = collectives[(collectives["status"] == "ok") & (collectives["impl"] == "torch")
                         & collectives["bytes"].notna()]
        extra = ok.assign(group_size=ok["world_size"])[["op", "world_size", "group_size", "bytes", "time_p50_us"]]
        keys = set(map(tuple, coll[["op", "world_size", "group_size"]].astype(str).values))
        extra = extra[[tuple(k) not in keys for k in extra[["op", "world_size", "group_size"]].astype(str).values]]
        coll = pd.concat([coll, extra], ignore_index=True)
    for (op, n, g), grp in coll.groupby(["op", "world_size", "group_size"]):
        pts = _points(grp)
        if len(pts) < 2 or int(g) < 2:
            continue
        fit = fit_collective(op, int(g), [p["bytes"] for p in pts], [p["time_p50_us"] * 1e-6 for p in pts])
        prof.collectives.append({"op": op, "algorithm": "ring", "world_size": int(n), "group_size": int(g),
                                 **_fit_fields(fit), "min_bytes": min(p["bytes"] for p in pts),
                                 "max_bytes": max(p["bytes"] for p in pts)})
    for (what, n), grp in calibration[calibration["kind"] == "p2p"].groupby(["op", "world_size"]):
        pts = _points(grp)
        if len(pts) >= 2:
            fit = fit_message([p["bytes"] for p in pts], [p["time_p50_us"] * 1e-6 for p in pts])
            prof.p2p.append({"what": what, "world_size": int(n), **_fit_fields(fit)})
    compute = calibration[calibration["kind"] == "compute"]
    for (dtype, n), grp in compute[compute["op"] == "matmul"].groupby(["dtype", "world_size"]):
        pts = _points(grp)
        if not pts:
            continue
        rate = sum(p["flops"] for p in pts) / sum(p["time_p50_us"] * 1e-6 for p in pts)
        prof.compute.append({"kind": "matmul", "dtype": dtype, "world_size": int(n), "flops_per_s": rate})
        for p in _points(compute[(compute["op"] != "matmul") & (compute["dtype"] == dtype)
                                 & (compute["world_size"] == n)]):
            secs = p["time_p50_us"] * 1e-6  # one layer, forward + backward
            prof.compute.append({"kind": p["op"], "dtype": dtype, "world_size": int(n),
                                 "flops_per_s": p["flops"] / secs, "layer_s": secs,
                                 "overhead_s": max(0.0, secs - p["flops"] / rate)})
    if not prof.collectives or not prof.p2p or not prof.compute:
        missing = [name for name, got in (("collectives", prof.collectives), ("point-to-point", prof.p2p),
                                          ("matmul rate", prof.compute)) if not got]
        raise ProfileError(f"{source!r} has no calibration measurements of {' or '.join(missing)}; {NEEDS}.")
    return prof


def _fit_fields(fit) -> dict:
    return {"alpha_s": fit.alpha, "beta_s_per_byte": fit.beta, "median_rel_error": fit.median_rel_error,
            "max_rel_error": fit.max_rel_error, "points": fit.points}


def profile_from_run(run_dir) -> Profile:
    from harness.records.results import ResultsError, read_run

    try:
        meta, frames = read_run(run_dir)
    except ResultsError as exc:
        raise ProfileError(str(exc)) from None
    bench = frames["benchmarks.csv"]
    coll = bench[bench["suite"] == "collectives"] if len(bench) else None
    return profile_from_frames(frames["calibration.csv"], coll, meta.get("backend") or "gloo", host_of(meta),
                               str(Path(run_dir)))
