"""A paradigm declares itself once: ``harness/<p>/__init__.py`` exports ``PARADIGM``, one ``Paradigm`` record.

The command line (``bench``, ``impls``), the report, the registry of implementations and the findings registry
read the list of records (``paradigms()``); none of them names a paradigm. Adding one adds a folder (its reference,
its ``harness/<p>/`` with this record, its suite and its docs page) and edits no shared file.

The arrows point one way: this module and the records import nothing of the CLI, the report or the registry's
functions; the records name their modules and functions by dotted path (``"harness.zero.bench"``), imported when
a command runs them, so reading the list stays cheap and no import circle closes. A package outside this one
declares a paradigm under the entry-point group ``paritybench.paradigms`` (the object: a ``Paradigm``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from dataclasses import dataclass
from functools import cache

ENTRY_POINT_GROUP = "paritybench.paradigms"


@dataclass(frozen=True)
class Bench:
    """One ``paritybench bench <name>`` sweep: ``plans(args)`` the validated ``(name, config, run_sweep)`` triples
    it runs (a bad argument raises ``UsageError`` before any run folder exists), ``arguments(parser, suite)`` its
    options, added to its own sub-command and, where ``in_all`` is set, to ``bench all``'s (each
    ``module:function``)."""

    name: str
    help: str
    plans: str
    arguments: str | None = None
    in_all: int | None = None
    """Its place in ``bench all`` (ascending), or None: not part of it."""
    calibrated: bool = False
    """Its rows carry the time this machine's profile predicts: ``--profile``, or a calibration sweep before it."""
    iters: int = 10
    warmup: int = 3
    """Its own command's default --iters / --warmup, and what it runs at most under ``bench all``'s shared ones
    (``harness.cli.sweep_args.counts``)."""
    all_iters: int | None = None
    """Fewer iterations than ``iters`` under ``bench all`` (the main job's 10 minutes on 2 cores); None: ``iters``."""
    own_world_size: str | None = None
    """None: it runs at ``--world-sizes``; else what sets its world size instead (a phrase: ``bench <name>
    --world-sizes ...`` is refused with it, never silently ignored; ``bench all``'s applies to the others)."""


@dataclass(frozen=True)
class Section:
    """One section of report.md: ``function(frame, run_dir, md) -> list of markdown lines``, given the rows of
    ``source`` (a run folder's CSV) whose ``suite`` is ``suite`` (None: every row), when there are any."""

    order: int
    """Its place in the report (ascending) among every paradigm's sections."""
    function: str
    """``module:function``."""
    suite: str | None = None
    source: str = "benchmarks.csv"


@dataclass(frozen=True)
class Paradigm:
    """Everything the shared tools know of one paradigm."""

    name: str
    """The contract's key (``registry``, ``--impl``, ``paritybench test``), and the results' ``suite``."""
    order: int
    """Its place in listings (``paritybench impls``)."""
    contract: str | None = None
    """``module:Protocol`` of its contract; None for a benchmark-only record (no implementations of its own)."""
    builtins: tuple = ()
    """Its built-in implementations (``registry.ImplSpec``)."""
    options: tuple = ()
    """``(spec, name its findings are registered under)``: a built-in under an option its users set, or a third
    party a suite holds directly (``registry.OPTIONS``)."""
    third_party: tuple = ()
    """``registry.ImplSpec`` of third-party code its benchmark times beside its implementations, not held through
    its contract (not among ``registry.names``)."""
    findings: tuple = ()
    """Its known third-party non-conformances (``findings.Finding``)."""
    benches: tuple = ()
    sections: tuple = ()
    headlines: str | None = None
    """``module:function(bench, link) -> lines`` for the report's summary, from the run's benchmark rows."""


def load(target: str):
    """The object ``module:attribute`` names."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


@cache
def paradigms() -> tuple[Paradigm, ...]:
    """Every declared paradigm, in ``order``: each ``harness`` sub-package's ``PARADIGM``, then entry points'."""
    import harness

    from .errors import UsageError  # a plug-in's bad declaration: one sentence (the CLI: exit code 2)

    found = []
    for info in pkgutil.iter_modules(harness.__path__):
        if info.ispkg:
            record = getattr(importlib.import_module(f"harness.{info.name}"), "PARADIGM", None)
            if isinstance(record, Paradigm):
                found.append(record)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        record = ep.load()
        if not isinstance(record, Paradigm):
            raise UsageError(f"entry point {ep.name!r} of {ENTRY_POINT_GROUP} is not a harness.paradigm.Paradigm.")
        found.append(record)
    names = [p.name for p in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"paradigm(s) {', '.join(twice)} declared more than once.")
    return tuple(sorted(found, key=lambda p: (p.order, p.name)))


def contracts() -> dict[str, type]:
    """paradigm -> its contract's Protocol, for every paradigm that has one."""
    return {p.name: load(p.contract) for p in paradigms() if p.contract}


def benches() -> dict[str, Bench]:
    """bench name -> its record, every paradigm's."""
    return {b.name: b for p in paradigms() for b in p.benches}


def sections() -> list[Section]:
    """Every paradigm's report sections, in order."""
    return sorted((s for p in paradigms() for s in p.sections), key=lambda s: s.order)
