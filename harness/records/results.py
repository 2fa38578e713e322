"""Run folders: ``run.json`` plus tidy CSVs, written incrementally and atomically.

A run folder ``<results-dir>/<run-id>/`` holds ``run.json`` (what ran, where), ``conformance.csv``,
``benchmarks.csv`` and ``samples.csv`` (every timed iteration of every benchmark row: what the gate's
significance test reads). Each CSV row is written with a single ``write`` of one whole line to a file opened
for appending, then flushed to disk (fsync): a run that is killed keeps every finished row, and never a
half-written line. ``run.json`` is replaced atomically (write a temporary file, fsync, rename). The
schema is versioned and documented in ``results/README.md``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from reference.files import atomic_write_text

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 2 added samples.csv; version-1 folders read with it empty (their times cannot be judged)."""

COMMON = ["schema_version", "run_id", "suite", "impl", "backend", "world_size", "dtype"]
CONFORMANCE_COLUMNS = COMMON + [
    "property", "collective", "op", "numel", "root", "in_place", "group", "seed",
    "outcome", "wrong", "detail", "max_rel_err", "release",
]
BENCHMARK_COLUMNS = COMMON + [
    "op", "reduce_op", "bytes", "count", "iters", "warmup",
    "time_p50_us", "time_p95_us", "time_min_us", "time_max_us", "time_mean_us", "time_cv",
    "algbw_gbps", "busbw_gbps", "wrong", "status", "detail",
    "microbatches", "virtual_stages", "bubble_measured", "bubble_predicted", "makespan_predicted_us",
    "bubble_simulated", "peak_activations_measured", "peak_activations_simulated",
    "bubble_ci_lo", "bubble_ci_hi", "rounds", "time_ci_lo_us", "time_ci_hi_us", "time_ci_level",
    "comm_bytes_measured", "comm_bytes_predicted",
    "zero_stage", "mem_params_bytes", "mem_grads_bytes", "mem_optimizer_bytes",
    "mem_params_predicted", "mem_grads_predicted", "mem_optimizer_predicted",
    "act_peak_bytes", "act_peak_predicted", "alloc_peak_bytes", "recompute_overhead_measured",
    "recompute_overhead_predicted",
    "time_planned_us", "bubble_planned", "plan_compute_us", "plan_tp_us", "plan_cp_us", "plan_ep_us", "plan_pp_us",
    "plan_bubble_us", "plan_dp_us", "plan_sync_us", "state_bytes_rank_max", "state_bytes_predicted", "tokens_per_s",
    "comm_bytes_routed", "dispatch_p50_us", "received_max", "comm_bytes_forward", "comm_bytes_forward_predicted",
    "comm_bytes_replicate", "comm_bytes_replicate_predicted",
]
BENCHMARK_KEY = ["suite", "op", "impl", "backend", "world_size", "dtype", "reduce_op", "bytes", "count",
                 "microbatches", "virtual_stages", "zero_stage"]
"""The independent variables of a benchmark row: two runs' rows with equal keys measure the same case."""
CONFORMANCE_KEY = ["suite", "property", "impl", "backend", "world_size", "dtype", "collective", "op", "numel",
                   "root", "in_place", "group", "seed"]
"""One executed example (or exact check) of a conformance row."""
SAMPLE_COLUMNS = ["schema_version", "run_id"] + BENCHMARK_KEY + ["iteration", "time_us"]
CALIBRATION_COLUMNS = ["schema_version", "run_id", "backend", "world_size", "kind", "op", "group_size", "dtype",
                       "bytes", "flops", "iters", "warmup", "time_p50_us", "time_p95_us", "time_min_us",
                       "time_max_us", "time_mean_us", "time_cv"]
"""The calibration sweep's measurements (``harness.cost_model.sweep``): what a machine profile is fitted from."""
FILES = {"conformance.csv": CONFORMANCE_COLUMNS, "benchmarks.csv": BENCHMARK_COLUMNS, "samples.csv": SAMPLE_COLUMNS,
         "calibration.csv": CALIBRATION_COLUMNS}


class ResultsError(ValueError):
    """A results folder that cannot be written, or a path that is not a run; one sentence."""


class CsvAppender:
    """Append rows with fixed columns to a CSV; one whole line per ``write``, fsynced."""

    def __init__(self, path: Path, columns: list[str]):
        self.path, self.columns = Path(path), list(columns)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:
            self._write(self.columns)

    def _write(self, values: list) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        self._write_text(buf.getvalue())

    def _write_text(self, text: str) -> None:
        data = text.encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a regular file takes the whole buffer; anything else is an error
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        os.fsync(self._fd)

    def append(self, row: dict) -> None:
        self.append_many([row])

    def append_many(self, rows: list[dict]) -> None:
        """All ``rows`` in one ``write`` (a killed run keeps all of them or none)."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in rows:
            unknown = set(row) - set(self.columns)
            if unknown:
                raise KeyError(f"columns {sorted(unknown)} are not in the schema of {self.path.name}")
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in self.columns])
        self._write_text(buf.getvalue())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def _git_revision() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{rev}{'-dirty' if rev and dirty else ''}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Where this run happens: versions, hardware, host, git revision."""
    import torch

    env = {
        "python": platform.python_version(), "torch": torch.__version__,
        "deepspeed": _version("deepspeed"), "megatron_core": _version("megatron-core"),
        "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "host": platform.node(),
        "os": platform.platform(), "git_revision": _git_revision(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
    }
    return {k: v for k, v in env.items() if v is not None}


class RunDir:
    """A run folder being written: ``run.json`` first (status "running"), rows as they finish."""

    def __init__(self, results_dir: str | os.PathLike, meta: dict, run_id: str | None = None):
        base = Path(results_dir)
        self.run_id = run_id or new_run_id()
        self.path = base / self.run_id
        try:
            self.path.mkdir(parents=True, exist_ok=False)
            probe = self.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ResultsError(f"cannot write results under {str(base)!r}: {exc.strerror or exc}.") from exc
        self.meta = {
            "schema_version": SCHEMA_VERSION, "run_id": self.run_id, "status": "running",
            "command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **environment(), **meta,
        }
        self._write_meta()
        self._files: dict[str, CsvAppender] = {}

    @classmethod
    def attach(cls, path: str | os.PathLike, run_id: str) -> RunDir:
        """Append rows to a run folder another process owns (a pytest-xdist worker, under its controller):
        ``run.json`` stays the owner's; ``update`` only collects into ``meta`` for the owner to merge."""
        run = cls.__new__(cls)
        run.path, run.run_id, run.meta, run._files, run.attached = Path(path), run_id, {}, {}, True
        return run

    attached = False

    def _write_meta(self) -> None:
        if self.attached:
            return
        atomic_write_text(self.path / "run.json", json.dumps(self.meta, indent=2, sort_keys=True) + "\n")

    def _appender(self, filename: str) -> CsvAppender:
        if filename not in self._files:
            self._files[filename] = CsvAppender(self.path / filename, FILES[filename])
        return self._files[filename]

    def append(self, filename: str, row: dict) -> None:
        """One finished row. A benchmark row's ``samples_us`` (every timed iteration, the max over ranks, from
        ``timing.summarize``) goes to samples.csv first, in one write: a row never lacks its samples."""
        row = dict(row)
        samples = row.pop("samples_us", None) if filename == "benchmarks.csv" else None
        row = {"schema_version": SCHEMA_VERSION, "run_id": self.run_id, **row}
        if samples:
            key = {c: row.get(c) for c in ["schema_version", "run_id"] + BENCHMARK_KEY}
            self._appender("samples.csv").append_many(
                [{**key, "iteration": i, "time_us": t} for i, t in enumerate(samples)])
        self._appender(filename).append(row)

    def create_files(self) -> None:
        """Write every CSV's header now, so that other processes appending to this folder (pytest-xdist
        workers, ``attach``) never race to write one."""
        for name in FILES:
            self._appender(name)

    def update(self, **meta) -> None:
        self.meta.update(meta)
        self._write_meta()

    def finish(self, status: str = "complete") -> None:
        for appender in self._files.values():
            appender.close()
        self.update(status=status, finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def read_run(run_dir: str | os.PathLike) -> tuple[dict, dict]:
    """(run.json, {csv name: pandas DataFrame}) of a run folder, or ``ResultsError`` if it is not one."""
    import pandas as pd

    path = Path(run_dir)
    meta_path = path / "run.json"
    if not path.is_dir() or not meta_path.is_file():
        raise ResultsError(f"{str(path)!r} is not a run folder: it has no run.json "
                           "(run folders are made by 'paritybench bench' under results/runs/).")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{str(meta_path)!r} is not valid JSON: {exc}.") from exc
    if meta.get("schema_version") not in READABLE_VERSIONS:
        raise ResultsError(f"{str(path)!r} has results schema version {meta.get('schema_version')!r}; "
                           f"this paritybench reads versions {', '.join(map(str, READABLE_VERSIONS))}.")
    frames = {}
    for name, columns in FILES.items():
        if (path / name).is_file():
            frames[name] = pd.read_csv(path / name, keep_default_na=False, na_values=[""]).reindex(
                columns=columns)  # an older schema's missing columns read as blank
        else:
            frames[name] = pd.DataFrame(columns=columns)
    return meta, frames
