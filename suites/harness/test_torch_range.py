"""Declared = tested: the torch floor ``pyproject.toml`` declares is the torch ``tox -e compat-oldest`` installs,
``.ci/run`` runs both ends of the range, ``.ci/installed`` pins no torch, and the docs say the same floor."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (ROOT / "tox.ini").is_file(), reason="an installed paritybench has no tox.ini")


def _floor() -> str:
    found = re.findall(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(found) == 1, f"pyproject.toml should declare torch>=X once, found {found}"
    return found[0]


def _compat_deps() -> dict[str, str]:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    deps = tox["testenv:compat-{newest,oldest}"]["deps"]
    return dict(re.findall(r"^\s*(newest|oldest):\s*(\S+)\s*$", deps, flags=re.M))


def test_the_oldest_compat_env_installs_the_declared_floor():
    floor, deps = _floor(), _compat_deps()
    pinned = re.fullmatch(r"torch==([0-9.]+)", deps.get("oldest", ""))
    assert pinned, f"compat-oldest must pin one torch release, got {deps.get('oldest')!r}"
    assert pinned[1].split(".")[:2] == floor.split(".")[:2], (pinned[1], floor)
    assert deps.get("newest") == "torch", f"compat-newest must take the newest torch, got {deps.get('newest')!r}"


def test_ci_runs_both_ends_and_installs_what_a_user_gets():
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"for env in compat-newest compat-oldest; do\n.*tox -e \"\$env\"", run), run  # one at a time
    installed = (ROOT / ".ci" / "installed").read_text()
    assert not re.search(r"torch==", installed), "the installed check pins torch: a user does not"


def test_the_docs_state_the_declared_floor():
    floor = _floor()
    for doc in ("README.md", "docs/architecture.md"):
        assert f"torch>={floor}" in (ROOT / doc).read_text(), f"{doc} does not state torch>={floor}"
