"""The README and docs/ link only to files inside the repository, and every link resolves: a user who
clones the project can read everything the README points at."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_stays_inside_the_repository_and_exists():
    pages = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) >= 10
    bad = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if not path:
                continue  # an anchor on the same page
            resolved = (page.parent / path).resolve()
            if "://" in target or not resolved.is_relative_to(ROOT) or not resolved.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert not bad, bad
