"""Every private API of another library that ``harness/`` and ``reference/`` use — torch's, Python's, a third party's: a
name with a leading underscore reached on something that is not ours — is listed in docs/architecture.md ("Every
private API ..."), in a row or paragraph naming the file and the name, beside the test of its fallback; and every
test that section names exists. Read from the source (the AST), not from the prose: a new private read, write or
import that the section does not list fails here, naming it.

What counts as ours: ``self`` / ``cls``, and what a file imports from this repository (``harness``, ``reference``,
``suites``, ``docs``, relative imports). Reached through a variable the AST cannot place, a name is another library's
unless ``OURS`` lists it (our own objects' attributes read from a module beside them) or it begins ``_paritybench``
(our marks on pytest's and torch's objects)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "reference", "suites", "docs")
SECTION = ("Every private API", "## Machines and findings")

OURS = {
    ("harness/runtime/hang.py", "_tmpdir"): "the World's own (harness.runtime.world), read by its hang report",
    ("harness/runtime/hang.py", "_stack_path"): "the World's own",
    ("harness/runtime/hang.py", "_procs"): "the World's own",
    ("harness/records/results.py", "_files"): "a Run's own (the same module)",
    ("harness/stack/dense.py", "_fields"): "a namedtuple's, which Python documents as public",
    ("harness/runtime/rank.py", "_exit"): "os._exit, which Python documents as public",
    ("reference/resume/threed.py", "_exit"): "os._exit, which Python documents as public",
}
"""(file, name) reached through a variable that is ours, or a name Python documents as public despite its underscore:
each with why."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith("_paritybench")


def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _imports(tree) -> dict[str, str]:
    """{name bound by an import anywhere in the file: the module it came from ("." for a relative import)}."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = "." if node.level else node.module or ""
    return out


def _ours(module: str | None) -> bool:
    return module is not None and (module.startswith(".") or module.split(".")[0] in PACKAGES)


def private_uses(source: str) -> set[str]:
    """The private names of other libraries one file's source reaches: attributes (read, written, ``getattr`` /
    ``hasattr`` / ``setattr`` by a literal name) on what is not ours, private modules it imports, private names it
    imports from them."""
    tree = ast.parse(source)
    imported, found = _imports(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not _ours("." if node.level else node.module):
            found.update(p for p in (node.module or "").split(".") if _private(p))
            found.update(a.name for a in node.names if _private(a.name))
        elif isinstance(node, ast.Import):
            found.update(p for a in node.names if not _ours(a.name) for p in a.name.split(".") if _private(p))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root(node.value)
            if root not in ("self", "cls") and not _ours(imported.get(root)):
                found.add(node.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            root = _root(node.args[0])
            if root not in ("self", "cls") and not _ours(imported.get(root)):
                found.add(node.args[1].value)
    return found


def _uses() -> set[tuple[str, str]]:
    """(file, name) of every private name of another library ``harness/`` and ``reference/`` reach."""
    return {(path.relative_to(ROOT).as_posix(), name) for package in ("harness", "reference")
            for path in (ROOT / package).rglob("*.py") for name in private_uses(path.read_text())}


def _entries() -> list[str]:
    """The section's table rows and paragraphs, one string each."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start, end = text.index(SECTION[0]), text.index(SECTION[1])
    entries, block = [], []
    for line in text[start:end].splitlines() + [""]:
        if line.startswith("|"):
            entries.append(line)
        elif line.strip():
            block.append(line)
        elif block:
            entries.append(" ".join(block))
            block = []
    return entries


def test_the_scan_sees_each_kind_of_private_use_and_not_ours():
    """The reader itself, on planted sources: each way of reaching another library's private name is found; ours is
    not."""
    source = ("import torch.utils._python_dispatch\n"
              "from torch.utils._pytree import tree_map\n"
              "from deepspeed.utils import _helper\n"
              "from harness.stack import _mine\n"
              "from . import _relative\n"
              "from deepspeed.utils import groups\n"
              "def f(engine, world):\n"
              "    groups._get_group()\n"
              "    engine._config.flag = True\n"
              "    hasattr(engine, '_linked')\n"
              "    self._own, cls._also = 1, 2\n"
              "    world._paritybench_mark = 3\n"
              "    _mine._x, __name__\n")
    assert private_uses(source) == {"_python_dispatch", "_pytree", "_helper", "_get_group", "_config", "_linked"}


def test_every_private_api_used_is_listed_with_its_file():
    entries = _entries()
    uses = _uses()
    unlisted = [f"{where}: {name}" for where, name in sorted(uses) if (where, name) not in OURS
                and not any(where in e and re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", e)
                            for e in entries)]
    assert not unlisted, ("docs/architecture.md's section on private APIs lists no row or paragraph naming both "
                          f"the file and the name of: {unlisted}")
    stale = [f"{where}: {name}" for where, name in OURS if (where, name) not in uses]
    assert not stale, f"OURS names what the source no longer reaches: {stale}"


def test_every_fallback_test_the_section_names_exists():
    tests = {node.name for path in (ROOT / "suites").rglob("test_*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
    entries = _entries()
    named = {m for e in entries for m in re.findall(r"`(?:[\w/.]+::)?(test_\w+)`", e)}
    rows = [e for e in entries if e.startswith("| `")]
    assert named and not named - tests, f"the section names tests that do not exist: {sorted(named - tests)}"
    without = [row.split("|")[1].strip() for row in rows if not re.search(r"`(?:[\w/.]+::)?test_\w+`|`suites/", row)]
    assert not without, f"rows naming no test of their fallback: {without}"
