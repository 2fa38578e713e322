"""What the gate compares: run folders (or merged baselines), checked before any verdict.

Refused with one sentence (exit 2): a path that is not a run folder, a run still ``running`` (its rows
may be half the sweep), and, unless ``allow_env_change``, two runs whose backend, device model or world
sizes differ, or whose sweep settings differ in what a case measures (model widths, sequence lengths:
everything but the sweep's extent and iteration counts). Version differences (torch, python, the
stacks, the git revision) are not refused: they are what a gate is for; the header shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.records.results import ResultsError, read_run

EXTENT_FIELDS = {"impls", "ops", "world_sizes", "min_bytes", "max_bytes", "factor", "iters", "warmup",
                 "dispatch_iters", "stages", "schedules", "microbatches", "layers", "policies", "layouts", "profile"}
"""Sweep settings that say how much is run (or which profile its predictions came from), not what one case
measures: they may differ."""
VERSION_FIELDS = ("python", "torch", "cuda", "deepspeed", "megatron_core", "git_revision", "os")


class GateError(ValueError):
    """Bad input to the gate: one sentence, exit 2."""


@dataclass
class Run:
    path: str
    meta: dict
    conformance: object
    benchmarks: object
    samples: object
    runs: int = 1
    """How many runs it holds (a merged baseline: several)."""
    world_sizes: list = field(default_factory=list)


def load(path: str) -> Run:
    """A finished run folder or baseline, or ``GateError``."""
    try:
        meta, frames = read_run(path)
    except ResultsError as exc:
        raise GateError(str(exc)) from None
    status = meta.get("status")
    if status != "complete":
        raise GateError(f"{path!r} is a run that is {status or 'of unknown status'} (run.json says so): compare "
                        "finished runs only (a killed run's rows are valid, but not a whole sweep).")
    conf, bench, samples = frames["conformance.csv"], frames["benchmarks.csv"], frames["samples.csv"]
    return Run(path, meta, conf, bench, samples, runs=len(meta.get("runs", [])) or 1,
               world_sizes=requested_world_sizes(meta, bench, conf))


def requested_world_sizes(meta: dict, bench, conf) -> list[int]:
    """The world sizes the run was set up with (the Worlds it started, its --world-sizes), not the ones its
    rows show: a case missing from NEW is a regression to report, not a different environment. Rows only
    for a folder that records neither."""
    sizes = {int(s) for s in meta.get("placement", {})} | set(meta.get("world_sizes") or [])
    for cfg in (meta.get("config") or {}).values():
        sizes |= set(cfg.get("world_sizes") or [])
    if not sizes:
        sizes = {int(s) for s in bench["world_size"].dropna()} | {int(s) for s in conf["world_size"].dropna()}
    return sorted(sizes)


def device_model(meta: dict) -> str:
    gpus = meta.get("gpus") or []
    return ", ".join(sorted(set(gpus))) if gpus else meta.get("cpu", "unknown CPU")


def backends(meta: dict) -> list[str]:
    return sorted(set(meta.get("backends") or []) | ({meta["backend"]} if meta.get("backend") else set()) - {"none"})


def environment_differences(base: Run, new: Run, world_sizes: bool = True) -> list[str]:
    """What makes the two runs measure different things (each one phrase); empty if comparable.
    ``world_sizes`` False: parts of one run (a pytest and a bench run) may use different world sizes."""
    out = []
    if backends(base.meta) != backends(new.meta):
        out.append(f"backend {'/'.join(backends(base.meta)) or 'none'} vs {'/'.join(backends(new.meta)) or 'none'}")
    if device_model(base.meta) != device_model(new.meta):
        out.append(f"device {device_model(base.meta)!r} vs {device_model(new.meta)!r}")
    if world_sizes and base.world_sizes != new.world_sizes:
        out.append(f"world sizes {base.world_sizes} vs {new.world_sizes}")
    for suite, cfg in sorted((base.meta.get("config") or {}).items()):
        other = (new.meta.get("config") or {}).get(suite)
        if other is None:
            continue
        for key in sorted(set(cfg) | set(other)):
            if key not in EXTENT_FIELDS and cfg.get(key) != other.get(key):
                out.append(f"{suite} setting {key} {cfg.get(key)!r} vs {other.get(key)!r}")
    return out


def version_differences(base: Run, new: Run) -> list[str]:
    return [f"{k} {base.meta.get(k, '-')} -> {new.meta.get(k, '-')}" for k in VERSION_FIELDS
            if base.meta.get(k) != new.meta.get(k)]


def check_comparable(base: Run, new: Run, allow_env_change: bool) -> list[str]:
    """The environment differences; ``GateError`` if there are any and they are not allowed."""
    diffs = environment_differences(base, new)
    if diffs and not allow_env_change:
        raise GateError(f"{base.path!r} and {new.path!r} ran in different environments ({'; '.join(diffs)}): "
                        "their numbers are not comparable; pass --allow-env-change to compare them anyway.")
    return diffs
