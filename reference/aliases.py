"""Old module names kept importable: a module that moved (``reference.compose`` -> ``reference.stack.compose``) is
still found under its old name — the same module object, so ``from reference.compose import Parallel3D`` and an
implementation spec ``harness.adapters.deepspeed_stack:CallerScalesLoss`` keep working for users who wrote them.
``install(table)`` puts one finder for ``table`` (old name -> new name; a package's submodules follow it) on
``sys.meta_path``; ``canonical(name)`` is a name's new spelling."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "reference.compose": "reference.stack.compose",
    "reference.dimensions": "reference.stack.dimensions",
    "reference.state": "reference.resume",
    "reference.topology": "reference.stack.topology",
}
"""This package's moved modules (harness/__init__.py installs harness's own table the same way)."""


def _target(table: dict, name: str) -> str | None:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        new = table.get(".".join(parts[:k]))
        if new is not None:
            return ".".join([new, *parts[k:]])
    return None


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, table: dict):
        self.table = table

    def find_spec(self, fullname, path=None, target=None):
        if _target(self.table, fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(_target(self.table, spec.name))

    def exec_module(self, module):
        """The module is the new one, already executed."""


def install(table: dict) -> None:
    if not any(isinstance(f, _Aliases) and f.table is table for f in sys.meta_path):
        sys.meta_path.insert(0, _Aliases(table))  # before the path finder: a moved package's submodules too


def canonical(name: str, table: dict) -> str:
    """``name`` (a module, or ``module:object``) under its new module name where it moved, else as it is."""
    module, sep, attr = name.partition(":")
    return (_target(table, module) or module) + sep + attr


install(MOVED)
