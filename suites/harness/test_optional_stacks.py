"""The optional stacks (megatron-core, DeepSpeed) are optional everywhere: with their packages gone, or
with only a parent package missing, pytest collects and skips them with the reason, ``paritybench impls``
says why, and a benchmark skips them in one line. The packages are hidden by an import blocker, so this runs the same
in the full env (where they are installed) and in ``tox -e minimal`` (where they are not). Its pytest and paritybench
sessions run in tox where a stack is missing (the minimal and compat envs); where both are installed (the cpu env)
they are the thorough env's (CI's ``-m thorough`` step): ~6 s of tox each, and CI's minimal env runs them anyway."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.records import registry
from harness.records.registry import ImplSpec

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]

# Run argv's command (pytest or paritybench) with the top-level packages megatron and deepspeed unimportable.
_BLOCKED = """
import importlib.abc, sys
class _Gone(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("megatron", "deepspeed"):
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}", name=name.split(".")[0])
sys.meta_path.insert(0, _Gone())
cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "pytest":
    import pytest
    sys.exit(pytest.main(args))
from harness.cli.main import main
sys.exit(main(args))
"""


INSTALLED = all(importlib.util.find_spec(name) is not None for name in ("megatron", "deepspeed"))
"""Both stacks installed: the cpu env's, where the sessions below are the thorough env's (the module docstring)."""
WHY = "thorough: both stacks are installed here; tox -e minimal runs this where they are not"


def _without_stacks(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "dev"}
    return subprocess.run([sys.executable, "-c", _BLOCKED, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env=env)


def test_a_missing_parent_package_is_a_skip_reason():
    """find_spec('a.b') raises ModuleNotFoundError when 'a' is missing; that is a skip, not a crash."""
    impl = ImplSpec("x", "tensor_parallel", "no_such_parent_xyz.core:X", requires=("no_such_parent_xyz.core",))
    assert registry.skip_reason(impl) == (
        "implementation 'x' needs the package 'no_such_parent_xyz.core', which is not installed")


def test_pytest_collects_and_skips_megatron_and_deepspeed_with_reasons(sweep):
    sweep.require(not INSTALLED, WHY)
    out = _without_stacks("pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "megatron or deepspeed",
                          "suites/tensor_parallel", "suites/zero")
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "error" not in log.lower().split("short test summary")[-1], log[-3000:]
    assert "passed" not in log.splitlines()[-1] and "skipped" in log.splitlines()[-1], log[-2000:]
    assert "needs the package 'megatron.core', which is not installed" in log, log[-3000:]
    assert "needs the package 'deepspeed', which is not installed" in log, log[-3000:]


def test_impls_and_bench_say_why_a_stack_is_skipped(sweep):
    sweep.require(not INSTALLED, WHY)
    out = _without_stacks("paritybench", "impls")
    assert out.returncode == 0, out.stderr
    lines = {tuple(line.split()[:2]): line for line in out.stdout.splitlines()}
    assert "skipped: implementation 'megatron' needs the package 'megatron.core'" in lines[("tensor_parallel",
                                                                                          "megatron")]
    assert "skipped: implementation 'deepspeed' needs the package 'deepspeed'" in lines[("zero", "deepspeed")]
    out = _without_stacks("paritybench", "bench", "zero", "--impls", "deepspeed", "--world-sizes", "2")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "paritybench: error: no zero implementation can run here (every one requested was skipped).")
    assert "skipping deepspeed: implementation 'deepspeed' needs the package 'deepspeed'" in out.stderr
