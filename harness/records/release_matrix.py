"""The stacks' release matrix: each third-party stack's newest release and each minor release of the last 12
months, one venv per stack (torch and the suites as the cpu env has them, the release installed in turn), the
stack's cases of the stack, expert-parallel and context-parallel suites (tox's profile, ``-k <stack>``), every
session's conformance rows merged into one run folder whose report holds one matrix: stack x release x case.

    python -m harness.records.release_matrix [--stacks deepspeed,torchtitan] [--out results/stacks-matrix] [--venvs DIR]

(``tox -e stacks-matrix``: nightly, outside tox's 10-minute budget; wheels come from pip's cache after the first
run.) A release that cannot be installed here (its Python, its torch) is a row of its own, ``unsupported`` with
pip's reason — never left out. ``MATRIX`` is the table: update it with each release (docs/guides/stacks.md,
"Releases")."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MATRIX: dict[str, dict] = {
    # stack: {"dist": the distribution, "releases": newest patch of each minor of the last 12 months (2025-12 to
    # 2026-12, the index's upload dates), "key": the -k expression, "extra": what it needs beside itself}
    "deepspeed": {"dist": "deepspeed", "releases": ["0.18.9", "0.19.8"], "key": "deepspeed", "extra": []},
    "megatron": {"dist": "megatron-core", "key": "megatron", "extra": [],
                 "releases": ["0.15.3", "0.16.1", "0.17.1", "0.18.2", "0.19.2"],
                 # their metadata requires Python 3.12: a venv of its own (torch's cp312 build from the index)
                 "python": {"0.17.1": "3.12", "0.18.2": "3.12", "0.19.2": "3.12"}},
    "torchtitan": {"dist": "torchtitan", "releases": ["0.2.2", "0.3.0"], "key": "torchtitan", "no_deps": True,
                   "extra": ["spmd_types==0.2.3", "tyro==1.0.17", "docstring_parser", "einops",
                             "torch_checkpointing==0.1.1", "tokenizers"],  # 0.2's protocols import tokenizers
                   # 0.2's llama3 package imports its data stack and metrics: with their own dependencies
                   "with_deps": {"0.2.2": ["datasets", "torchdata", "tensorboard", "tomli", "fsspec", "pillow"]}},
    "accelerate": {"dist": "accelerate", "releases": ["1.13.0", "1.14.0", "1.15.0", "1.16.0"], "key": "accelerate",
                   "extra": []},
    # its expert parallelism (suites/expert_parallel/test_transformers_ep.py): 4.57's patch of the period and every
    # 5.x minor (DistributedConfig(ep_size=) came with 5.19: the releases before are rows of their own, releases.DRIVEN)
    "transformers": {"dist": "transformers", "key": "transformers", "extra": ["accelerate"],
                     "releases": ["4.57.6", "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0",
                                  "5.8.1", "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1",
                                  "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0",
                                  "5.24.0", "5.25.0"]},
}
TORCH = "torch==2.13.0"
SUITES = ["suites/stack", "suites/expert_parallel", "suites/context_parallel"]


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)


def python_for(version: str | None) -> str | None:
    """An interpreter of Python ``version`` (None: this one): ``python<version>`` on the PATH, else pyenv's."""
    if version is None:
        return sys.executable
    candidates = [shutil.which(f"python{version}"), *sorted(glob.glob(os.path.expanduser(
        f"~/.pyenv/versions/{version}*/bin/python")))]
    for path in filter(None, candidates):
        done = subprocess.run([path, "--version"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.split()[-1].startswith(version):
            return path
    return None


def _venv(venvs: Path, stack: str, python: str | None = None) -> Path:
    """The stack's venv for ``python`` (a version; None: this interpreter's), made once and reused: torch as the
    cpu env pins it, paritybench editable with its test extra."""
    venv = venvs / (stack + (f"-py{python}" if python else ""))
    if not (venv / "bin" / "python").exists():
        interpreter = python_for(python)
        if interpreter is None:
            raise RuntimeError(f"no Python {python} here (python{python} on the PATH, or pyenv's)")
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
        done = _pip(venv, TORCH, "-e", f"{ROOT}[test]")
        if done.returncode:
            raise RuntimeError(f"the {stack} venv could not be made: {done.stderr.strip().splitlines()[-1:]}")
    return venv


def _install(venv: Path, spec: dict, release: str) -> str | None:
    """Install ``release`` in place of the one there; None, or pip's last line where it cannot."""
    pinned = f"{spec['dist']}=={release}"
    # numpy and pandas resolved with the release (megatron-core 0.15 wants numpy < 2, the pandas of the first
    # install does not): one consistent set, or pip's sentence
    together = [] if spec.get("no_deps") else ["numpy", "pandas"]
    done = _pip(venv, *(["--no-deps"] if spec.get("no_deps") else []), pinned, *spec["extra"], TORCH, *together)
    if not done.returncode and spec.get("with_deps", {}).get(release):  # what this release imports, resolved
        done = _pip(venv, *spec["with_deps"][release], TORCH)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["pip failed"])[-1]
    return None


def _not_driven(venv: Path, spec: dict) -> str | None:
    """The adapters' own sentence where they do not drive the installed release (``releases.not_driven``)."""
    code = f"from harness.records.releases import not_driven; print(not_driven({spec['dist']!r}) or '')"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    return done.stdout.strip() or None


def _session(venv: Path, spec: dict, results: Path) -> int:
    """One pytest session of the stack's cases into ``results`` (its own run folder)."""
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q", *SUITES, "-k", spec["key"],
           "--results-dir", str(results)]
    env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "ci", "DS_ACCELERATOR": "cpu"}
    return subprocess.run(cmd, cwd=ROOT, env=env, timeout=7200).returncode


def run(stacks: list[str], out: Path, venvs: Path, releases: dict | None = None) -> Path:
    """Every (stack, release) of ``stacks`` (``releases``: a stack's own list in place of ``MATRIX``'s, to bisect a
    finding's range): one run folder under ``out`` holding every session's rows."""
    import pandas as pd

    from harness.records.results import RunDir, read_run

    chosen = {s: (releases or {}).get(s, MATRIX[s]["releases"]) for s in stacks}
    run_dir = RunDir(out, {"suite": "stacks-matrix", "matrix": chosen})
    for stack in stacks:
        spec = MATRIX[stack]
        for release in chosen[stack]:
            python = spec.get("python", {}).get(release)
            try:
                venv = _venv(venvs, stack, python)
                why = _install(venv, spec, release)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                venv, why = None, str(exc)
            detail = f"{spec['dist']} {release} does not install here: {why}" if why else _not_driven(venv, spec)
            if detail:
                run_dir.append("conformance.csv", {"suite": "stack", "impl": stack, "release": release,
                                                   "property": "install", "outcome": "unsupported", "detail": detail})
                continue
            with tempfile.TemporaryDirectory() as tmp:
                code = _session(venv, spec, Path(tmp))
                for folder in Path(tmp).iterdir():
                    rows = read_run(folder)[1]["conformance.csv"]
                    for row in rows.to_dict("records"):
                        clean = {k: v for k, v in row.items() if not pd.isna(v) and k not in ("schema_version",
                                                                                              "run_id")}
                        run_dir.append("conformance.csv", {**clean, "release": clean.get("release") or release})
            print(f"{stack} {release}: pytest exit {code}", flush=True)
    run_dir.finish("complete")
    return run_dir.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.records.release_matrix",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default=",".join(MATRIX), help=f"of {', '.join(MATRIX)}")
    parser.add_argument("--out", default="results/stacks-matrix", help="the parent of the run folder")
    parser.add_argument("--venvs", default=".tox/stacks-matrix-venvs", help="where each stack's venv is kept")
    parser.add_argument("--releases", action="append", default=[], metavar="STACK=V1,V2",
                        help="these releases of STACK in place of the table's (bisecting a finding's range)")
    args = parser.parse_args(argv)
    stacks = [s for s in args.stacks.split(",") if s]
    chosen = {}
    for item in args.releases:
        stack, _, versions = item.partition("=")
        if stack not in stacks or not versions:
            print(f"paritybench: error: --releases takes STACK=V1,V2 for a stack of --stacks; got {item!r}.",
                  file=sys.stderr)
            return 2
        chosen[stack] = versions.split(",")
    unknown = [s for s in stacks if s not in MATRIX]
    if unknown:
        print(f"paritybench: error: unknown stack(s) {', '.join(unknown)}; choose from {', '.join(MATRIX)}.",
              file=sys.stderr)
        return 2
    from harness.cli.parsing import output_path
    from harness.errors import UsageError

    try:  # before the venvs' minutes
        output_path(args.out, "--out", folder=True)
        output_path(args.venvs, "--venvs", folder=True)
    except UsageError as exc:
        print(f"paritybench: error: {exc}", file=sys.stderr)
        return 2
    path = run(stacks, Path(args.out), Path(args.venvs), chosen)
    from harness.cli.report import write_report

    print(f"wrote {write_report(str(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
