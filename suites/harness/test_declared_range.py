"""Declared = tested: the floor of every dependency ``pyproject.toml`` declares for ``paritybench[test]`` — torch's and
numpy's, pandas', pytest's, hypothesis'... — is the release ``.ci/floors.txt`` pins, which ``tox -e compat-oldest``
installs together (its PIP_CONSTRAINT) on ``requires-python``'s floor, while compat-newest takes the newest of each on
a newer Python; ``tox -e lint`` holds every file to that Python floor; ``.ci/run`` runs all of it, ``.ci/installed``
pins no torch, and the docs say the same torch floor."""

from __future__ import annotations

import configparser
import os
import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (ROOT / "tox.ini").is_file(), reason="an installed paritybench has no tox.ini")


def _floor() -> str:
    found = re.findall(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert len(found) == 1, f"pyproject.toml should declare torch>=X once, found {found}"
    return found[0]


def _declared() -> dict[str, str]:
    """{distribution: its declared floor} of ``dependencies`` and the ``test`` extra (each ``name>=X``; a dependency
    without a floor is an error here: its oldest release would be anything)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)[1]
    test = re.search(r"^test = \[(.*?)\]", text, re.M)[1]
    uncommented = "\n".join(line.split("#", 1)[0] for line in (block + "\n" + test).splitlines())
    out = {}
    for line in re.findall(r'"([^"]+)"', uncommented):
        req = Requirement(line)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{line!r} declares no single floor (>=X)"
        out[req.name.lower()] = floors[0]
    return out


def _pinned() -> dict[str, str]:
    """{distribution: release} of .ci/floors.txt (``name==X`` lines; comments and blank lines aside)."""
    out = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f".ci/floors.txt: {line!r} is not name==release"
            out[name.strip().lower()] = version.strip()
    return out


def _python_floor() -> str:
    found = re.findall(r'^requires-python = ">=([0-9.]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(found) == 1, f"pyproject.toml should declare requires-python = \">=X\" once, found {found}"
    return found[0]


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


def test_the_floors_file_pins_every_declared_floor_and_nothing_else():
    declared, pinned = _declared(), _pinned()
    assert set(pinned) == set(declared), (sorted(set(pinned) ^ set(declared)))
    off = {d: (declared[d], pinned[d]) for d in declared if Version(declared[d]) != Version(pinned[d])}
    assert not off, f"declared floor != the release .ci/floors.txt pins: {off}"


def test_the_oldest_compat_env_installs_the_floors_and_the_newest_the_newest():
    env = _tox()["testenv:compat-{newest,oldest}"]
    settings = dict(re.findall(r"^\s*(newest|oldest): PIP_CONSTRAINT = (\S+)\s*$", env["set_env"], flags=re.M))
    assert settings == {"newest": "/dev/null", "oldest": "{toxinidir}/.ci/floors.txt"}, settings
    assert re.search(r"^\s*oldest: PARITYBENCH_FLOORS = \{toxinidir\}/\.ci/floors\.txt\s*$", env["set_env"], re.M)
    assert [d.strip() for d in env["deps"].splitlines() if d.strip()] == ["torch"], env["deps"]  # no pin of its own
    pythons = dict(re.findall(r"^\s*(newest|oldest): python(\S+)\s*$", env["base_python"], flags=re.M))
    assert pythons["oldest"] == _python_floor(), pythons  # the Python floor too
    assert Version(pythons["newest"]) > Version(pythons["oldest"]), pythons
    assert Version(_pinned()["torch"]) == Version(_floor())
    from harness.records.releases import TESTED  # what `paritybench impls` tells a user on torch's floor

    assert Version(TESTED["torch"][0]) == Version(_pinned()["torch"]), TESTED["torch"]


def test_the_floors_env_has_the_floors_installed():
    """In ``tox -e compat-oldest`` (PARITYBENCH_FLOORS names the file): every pinned distribution is installed at its
    pin — the constraint reached pip, and no later step upgraded one."""
    path = os.environ.get("PARITYBENCH_FLOORS")
    if not path:
        pytest.skip("runs in tox -e compat-oldest (PARITYBENCH_FLOORS unset)")
    assert Path(path).resolve() == (ROOT / ".ci" / "floors.txt").resolve(), path
    installed = {d: Version(metadata.version(d)).public for d in _pinned()}
    off = {d: (v, installed[d]) for d, v in _pinned().items() if Version(installed[d]) != Version(v)}
    assert not off, f"installed != .ci/floors.txt: {off}"


def test_lint_holds_the_code_to_the_declared_python_floor():
    """vermin's target in ``tox -e lint`` is ``requires-python``'s floor (compat-oldest runs a part of the suites on
    that Python; vermin reads every file, the stacks' adapters that need packages compat does not install included),
    and ``.ci/run`` runs that env."""
    target = re.findall(r"^\s*vermin --target=([0-9.]+)- ", _tox()["testenv:lint"]["commands"], re.M)
    assert target == [_python_floor()], target
    assert re.search(r"^\.tox-venv/bin/tox -e lint$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_no_pytest_command_of_tox_names_a_path_inside_another():
    """pytest 8.0 up to its fix of #12083 (the declared floor, 8.0.0, among them) collects only the file when a file
    and its directory are both given: compat-oldest ran 783 of its 951 tests so (suites/zero and suites/tensor_parallel
    left out, every test passing) until its command stopped naming their findings files twice."""
    tox = _tox()
    for section in tox.sections():
        for command in re.split(r"\n(?=\S)", tox[section].get("commands", "").replace("\\\n", " ")):
            paths = [Path(a) for a in command.split() if a.startswith("suites")]
            inside = [(str(a), str(b)) for a in paths for b in paths if a != b and b in a.parents]
            assert not inside, f"[{section}] names a path inside another it names: {inside}"


def test_ci_runs_both_ends_and_installs_what_a_user_gets():
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"for env in compat-newest compat-oldest; do\n.*tox -e \"\$env\"", run), run  # one at a time
    installed = (ROOT / ".ci" / "installed").read_text()
    assert not re.search(r"torch==", installed), "the installed check pins torch: a user does not"


def test_the_docs_state_the_declared_floor():
    floor = _floor()
    for doc in ("README.md", "docs/architecture.md"):
        assert f"torch>={floor}" in (ROOT / doc).read_text(), f"{doc} does not state torch>={floor}"
