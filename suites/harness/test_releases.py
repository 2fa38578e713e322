"""``paritybench impls`` says which release of each stack is installed and whether the suite's runs cover it: a user
on an untested release is told so in one line, never silently passed (harness/records/releases.py)."""

from __future__ import annotations

import pytest

from harness.cli.main import main
from harness.records import releases


@pytest.mark.parametrize("version, tested", [("0.19.8", True), ("0.18.6", False), ("0.20.0", False)])
def test_an_installed_release_is_said_to_be_tested_or_not(monkeypatch, version, tested):
    monkeypatch.setitem(releases.TESTED, "deepspeed", ("0.19.8", "0.19.8"))
    monkeypatch.setattr(releases, "_installed", lambda dist: version if dist == "deepspeed" else None)
    note = releases.release_note("deepspeed")
    assert note.startswith(f"deepspeed {version}: ") and "\n" not in note
    assert ("a tested release" in note) == tested and ("NOT a release" in note) == (not tested), note
    assert "0.19.8" in note  # the tested range is named either way


def test_a_range_is_inclusive_at_both_ends(monkeypatch):
    monkeypatch.setitem(releases.TESTED, "torch", ("2.12.1", "2.15.0"))
    assert [releases.tested("torch", v) for v in ("2.12.0", "2.12.1", "2.13.0+cpu", "2.15.0", "2.15.1")] == \
        [False, True, True, True, False]


def test_a_distribution_not_installed_gets_no_line(monkeypatch):
    monkeypatch.setattr(releases, "_installed", lambda dist: None)
    assert releases.release_note("megatron-core") is None


def test_impls_lists_the_installed_releases(capsys):
    assert main(["impls"]) == 0
    out = capsys.readouterr().out
    section = out.split("releases installed:\n", 1)[1].splitlines()
    assert section[0].startswith("  torch ") and all(line.startswith("  ") for line in section), section
    # every distribution the table lists that is installed here has its line (the minimal env: torch's alone)
    installed = [d for d in releases.TESTED if d != "torch" and releases._installed(d)]
    for dist in installed:
        assert any(line.startswith(f"  {dist} ") for line in section), (dist, section)


def test_a_release_older_than_the_adapters_drive_is_a_skip_reason_in_one_sentence(monkeypatch):
    """torchtitan 0.2.1 is not driven (the adapters drive 0.2.2's and 0.3's APIs): every implementation requiring it
    skips with that sentence, as a missing package does — never a crash per case."""
    from harness.records import registry

    monkeypatch.setattr(releases, "_installed", lambda dist: "0.2.1" if dist == "torchtitan" else None)
    why = releases.not_driven("torchtitan")
    assert why and why.startswith("torchtitan 0.2.1 is older than the adapters drive (>= 0.2.2") and "\n" not in why
    import importlib.util

    said = registry.skip_reason(registry.resolve("torchtitan", "stack"))
    installed = all(importlib.util.find_spec(m) for m in ("torchtitan", "spmd_types", "tyro", "einops"))
    assert said == why if installed else "not installed" in said, said  # where installed, the registry says it
    for driven in ("0.2.2", "0.3.0"):
        monkeypatch.setattr(releases, "_installed", lambda dist, driven=driven: driven)
        assert releases.not_driven("torchtitan") is None and releases.not_driven("deepspeed") is None


@pytest.mark.checkout  # reads the clone's pyproject.toml
@pytest.mark.parametrize("extra, dist", [("megatron", "megatron-core"), ("deepspeed", "deepspeed"),
                                         ("accelerate", "accelerate"), ("torchao", "torchao")])
def test_each_stacks_declared_floor_is_the_oldest_release_the_matrix_holds(extra, dist):
    """Declared = tested: pyproject.toml's extra for a stack names the oldest release of ``TESTED`` (what the release
    matrix measured), and the matrix runs that release's minor (its newest patch, or that release itself)."""
    import re
    from pathlib import Path

    from harness.records.release_matrix import MATRIX

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floor = re.findall(rf'^{extra} = \["{re.escape(dist)}>=([0-9.]+)"\]', text, re.M)
    assert floor == [releases.TESTED[dist][0]], (floor, releases.TESTED[dist])
    if dist == "torchao":  # not a stack: no release matrix; its one release is the newest (TESTED's docstring)
        return
    stack = next(name for name, spec in MATRIX.items() if spec["dist"] == dist)
    minor = releases._release(floor[0])[:2]
    assert any(releases._release(r)[:2] == minor for r in MATRIX[stack]["releases"]), MATRIX[stack]["releases"]


@pytest.mark.checkout  # reads the clone's docs
def test_the_ranges_the_docs_quote_are_the_table():
    """Every tested range the docs quote in ``paritybench impls``' words ("a tested release (A to B)", "(tested: A to
    B)") is ``TESTED``'s for that distribution: an example output goes stale when a range moves (it did: torch's
    floor 2.12.1 -> 2.12.0)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    quoted = [(path.relative_to(root), m["dist"], m["lo"], m["hi"] or m["lo"])
              for path in sorted((root / "docs").rglob("*.md")) + [root / "README.md"]
              for m in re.finditer(r"(?P<dist>[a-z][a-z-]*) \S+: (?:a tested release \(|NOT a release this suite was "
                                   r"measured on \(tested: )(?P<lo>[0-9.]+)(?: to (?P<hi>[0-9.]+))?\)",
                                   path.read_text())]
    assert quoted, "the docs no longer quote impls' release lines: this test reads nothing"
    stale = [q for q in quoted if releases.TESTED.get(q[1]) != q[2:]]
    assert not stale, stale
