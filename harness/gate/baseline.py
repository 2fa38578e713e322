"""``paritybench baseline RUN [RUN ...] --out DIR``: merge finished runs into one run folder.

Two uses: repeats of the same sweep (a baseline whose per-iteration samples are pooled, so that the
gate sees more of the runner's noise than one run shows), and parts of one CI run (the suites' run
folder and the benchmark sweep's) joined so that ``compare`` takes them as one. The result is itself a
run folder (``read_run``, ``report`` and ``compare`` read it): the rows of every run with their own
``run_id``, and ``run.json`` with ``kind: baseline`` and ``runs`` listing each run. Written into a
temporary folder and renamed into place: a crash leaves no half baseline.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness.records.results import FILES, SCHEMA_VERSION, atomic_write_text
from harness.runtime import placement

from .inputs import GateError, environment_differences, load

RUN_FIELDS = ("run_id", "git_revision", "started", "finished", "torch", "command", "suite")


def merge(paths: list[str], out: str, allow_env_change: bool = False) -> Path:
    if not paths:
        raise GateError("baseline needs at least one run folder.")
    runs = [load(p) for p in paths]
    ids = [r.meta.get("run_id") for r in runs]
    if len(set(ids)) != len(ids):
        raise GateError(f"the same run is given twice ({', '.join(i for i in ids if ids.count(i) > 1)}).")
    for other in runs[1:]:
        diffs = environment_differences(runs[0], other, world_sizes=False)
        if diffs and not allow_env_change:
            raise GateError(f"{runs[0].path!r} and {other.path!r} ran in different environments "
                            f"({'; '.join(diffs)}); pass --allow-env-change to merge them anyway.")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise GateError(f"--out {out!r} already exists and is not empty; choose a new folder (a baseline is "
                        "replaced by writing a new one and renaming it).")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write(runs, tmp, target.name)
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _write(runs, folder: Path, name: str) -> None:
    import pandas as pd

    meta = dict(runs[0].meta)
    members = []
    for r in runs:
        members += r.meta.get("runs") or [{k: r.meta.get(k) for k in RUN_FIELDS if r.meta.get(k) is not None}]
    config = {}
    for r in runs:
        config.update(r.meta.get("config", {}))
        meta.update(placement.merged(meta, r.meta))
    meta.update(schema_version=SCHEMA_VERSION, run_id=name, kind="baseline", status="complete", runs=members,
                config=config, merged=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for key in ("command", "started", "finished", "suite"):
        meta.pop(key, None)
    # what the gate judges; a run's calibration.csv (the planner's input) stays in the run folder
    for filename, attr in {"conformance.csv": "conformance", "benchmarks.csv": "benchmarks",
                           "samples.csv": "samples"}.items():
        columns = FILES[filename]
        frames = [getattr(r, attr) for r in runs if len(getattr(r, attr))]
        if frames:
            merged = pd.concat(frames, ignore_index=True).reindex(columns=columns)
            merged["schema_version"] = SCHEMA_VERSION
            merged.to_csv(folder / filename, index=False)
    atomic_write_text(folder / "run.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
