"""``.ci/run`` is CI: it runs the README's test command as a user copies it, and every step's failure fails the run.
Under ``set -e`` bash ignores the failure of a command left of ``&&`` — ``tox -e minimal && rm -rf .tox/minimal``
passed CI with a failing minimal env wherever nothing after it failed — so the one ``&&`` list is the README's own
line, whose last command (tox) is the step."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / ".ci" / "run"
pytestmark = [pytest.mark.checkout,
              pytest.mark.skipif(not RUN.is_file(), reason="an installed paritybench has no .ci/run")]


def _steps() -> list[str]:
    """.ci/run's command lines (comments and blank lines out, continuations joined)."""
    text = RUN.read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _readme_tests() -> str:
    """The README's test command: its third line (after the fence, the main job's line, then the tests')."""
    return (ROOT / "README.md").read_text().splitlines()[2]


def test_ci_runs_the_readme_test_line_verbatim_under_set_e():
    readme_tests = _readme_tests()
    steps = _steps()
    assert "set -euo pipefail" in steps[:3], steps[:3]
    assert readme_tests in steps, readme_tests
    assert readme_tests.rsplit("&&", 1)[1].strip().endswith("tox"), readme_tests


def test_no_step_fails_silently_left_of_an_and_list():
    readme_tests = _readme_tests()
    lists = [s for s in _steps() if "&&" in s and s != readme_tests]
    assert lists == [], f"a failure left of && does not stop .ci/run under set -e: {lists}"
