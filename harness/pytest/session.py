"""The pytest session around the suites: what it counts and reports, and how it runs under pytest-xdist.

Loaded by ``harness.pytest.plugin`` (its ``pytest_plugins``). The summary lines (``--impl`` specs no test
exercised, harness errors, time per suite, World spawns) are counted from test reports, so that under
pytest-xdist the controller counts its workers' tests; the workers append to the controller's one run
folder and hand back what it merges into run.json. Benchmark tests (pytest-benchmark) are opt-in.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.runtime import placement


def pytest_configure(config):
    config.pluginmanager.register(_Accounting(config), "paritybench-accounting")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, controller side: each worker appends its rows to the controller's one run folder (one
    whole line per write to files opened for appending: lines from several processes never interleave)."""
    run = node.config._paritybench_run
    if run is not None:
        node.workerinput["paritybench_run"] = (str(run.path), run.run_id)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist, controller side: merge what a worker's Worlds recorded (placement) into run.json."""
    run, meta = node.config._paritybench_run, getattr(node, "workeroutput", {}).get("paritybench_meta")
    if run is not None and meta:
        run.update(**placement.merged(run.meta, meta))
    spawns = getattr(node, "workeroutput", {}).get("paritybench_spawns", {})
    totals = node.config._paritybench_spawns
    for size, count in spawns.items():
        totals[int(size)] = totals.get(int(size), 0) + count


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Mark the report (its user_properties travel from pytest-xdist workers to the controller) with the
    --impl specs the test takes and whether it hit a harness error; ``_Accounting`` counts."""
    outcome = yield
    report = outcome.get_result()
    params = getattr(getattr(item, "callspec", None), "params", {})
    report.user_properties.append(("paritybench_impls", sorted(v for k, v in params.items() if k.endswith("_impl"))))
    parts = Path(str(item.path)).parts  # the folder under suites/, cloned or installed (site-packages/suites/...)
    if "suites" in parts[:-1]:
        report.user_properties.append(("paritybench_suite", parts[len(parts) - 1 - parts[::-1].index("suites") + 1]))
    if call.excinfo is not None and call.excinfo.errisinstance(HarnessError):
        report.user_properties.append(("paritybench_harness_error", True))


class _Accounting:
    """For the summary (registered per session; pytest_runtest_logreport gets no config): which --impl specs a
    test exercised (its body ran: passed, failed or xfailed), the seconds per suite (setup, call and
    teardown), and the tests that hit a harness error. Under pytest-xdist the controller counts the
    workers' reports."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        config = self.config
        props = dict(report.user_properties)
        if report.when == "call" and (not report.skipped or hasattr(report, "wasxfail")):
            config._paritybench_exercised.update(props.get("paritybench_impls", []))
        if props.get("paritybench_harness_error") and report.nodeid not in config._paritybench_harness_errors:
            config._paritybench_harness_errors.append(report.nodeid)
        suite = props.get("paritybench_suite") or report.nodeid.split("::")[0]
        config._paritybench_seconds[suite] = config._paritybench_seconds.get(suite, 0.0) + report.duration


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """An implementation the user named that no test exercised fails the session: nothing ran for it. A
    pytest-xdist worker hands the controller what it merges (placement, World spawns)."""
    config = session.config
    if hasattr(config, "workeroutput"):
        run, cache = config._paritybench_run, getattr(config, "_paritybench_worlds", None)
        if run is not None:
            config.workeroutput["paritybench_meta"] = run.meta
        if cache is not None:
            cache.close()  # the session fixture's teardown has run; closing again only collects the counts
            config.workeroutput["paritybench_spawns"] = {str(k): v for k, v in cache.spawns.items()}
        return
    named = config.getoption("--impl")
    if not named or exitstatus not in (0, 5) or config.option.collectonly:
        return
    missing = [spec for spec in named if spec not in config._paritybench_exercised]
    if missing:
        config._paritybench_unexercised = missing
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def thorough_run(config) -> bool:
    """The run takes the larger sweeps: the thorough hypothesis profile, or a marker expression selecting them
    (``-m thorough``, ``-m "thorough or benchmark"``; not ``-m "not thorough"``, which asks for tox's selection)."""
    markexpr = config.getoption("markexpr", "") or ""
    selects = re.search(r"\bthorough\b", markexpr) and not re.search(r"\bnot\s*\(?\s*thorough\b", markexpr)
    return bool(selects) or os.environ.get("PARITYBENCH_HYPOTHESIS_PROFILE") == "thorough"


def takes_tox_rows(config) -> bool:
    """The run takes the rows a widening table runs in tox: every run but one whose marker expression selects no
    unmarked test — ``-m thorough`` (CI's step, after tox ran those rows), marker names joined by ``or`` with
    ``thorough`` among them. An expression with ``not`` or ``and`` takes them (running a row twice rather than none)."""
    words = set(re.findall(r"\w+", config.getoption("markexpr", "") or ""))
    return not ("thorough" in words and not {"not", "and"} & words)


@dataclass(frozen=True)
class Sweep:
    """What of a widening table this run takes (the ``sweep`` fixture): its tox rows (``tox_rows``: every run but
    ``-m thorough``) and the rest (``wider``: a thorough run). Tox takes the first, ``tox -e thorough`` both, CI's
    ``-m thorough`` step the second alone — tox ran the first."""

    tox_rows: bool
    wider: bool

    def takes(self, in_tox: bool) -> bool:
        return self.tox_rows if in_tox else self.wider

    def rows(self, rows, in_tox, why_thorough: str) -> list:
        """The rows of ``rows`` this run takes (``in_tox(row)``: whether tox runs it); none of them: the test is
        skipped, with ``why_thorough`` where they are the thorough env's."""
        taken = [row for row in rows if self.takes(bool(in_tox(row)))]
        if rows and not taken:
            self.require(bool(in_tox(rows[0])), why_thorough)  # all of one kind: the one this run leaves
        return taken

    def require(self, in_tox: bool, why_thorough: str) -> None:
        """Skip a case this run does not take, with the reason: ``why_thorough`` for a case of the thorough env."""
        if not self.takes(in_tox):
            pytest.skip(why_thorough if not in_tox else
                        "ran in tox: a -m thorough run takes the rest of its table (harness.pytest.session.Sweep)")

    @classmethod
    def of(cls, config) -> Sweep:
        return cls(takes_tox_rows(config), thorough_run(config))


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection: a widening table is marked first
def pytest_collection_modifyitems(config, items):
    """Benchmark tests (marker ``benchmark``) are opt-in: without ``-m`` naming them or ``--benchmark-only``
    they are deselected, except the smoke test (marker ``paritybench_smoke``), so the default run stays short.
    The larger sweeps (marker ``thorough``) run under the thorough hypothesis profile or ``-m thorough``; in such a
    run a test whose table widens there (it takes the ``sweep`` or the ``thorough`` fixture: its tox rows in every
    run, the rest there) is a thorough case too, so ``-m thorough`` (CI's step after tox) runs every case tox left
    out — and, through ``sweep``, only those. With
    ``--impl`` naming only implementations of your own, the suite's own checks (its planted bugs, the built-in
    stacks' cases, the coverage of its case lists: every test that takes no ``<paradigm>_impl``) are
    deselected: what runs is what holds yours."""
    markexpr = config.getoption("markexpr", "") or ""
    benchmarks = "benchmark" in markexpr or config.getoption("benchmark_only", False)
    thorough = thorough_run(config)
    yours_only = yours_alone(config)
    keep, drop = [], []
    for item in items:
        if thorough and {"thorough", "sweep"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.thorough)
        opted_out = (not benchmarks and item.get_closest_marker("benchmark")
                     and not item.get_closest_marker("paritybench_smoke"))
        opted_out = opted_out or (not thorough and item.get_closest_marker("thorough"))
        opted_out = opted_out or (yours_only and not takes_an_impl(item))
        (drop if opted_out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if not in_checkout():
        skip = pytest.mark.skip(reason="needs a paritybench checkout (its docs/, tox.ini, conftest.py): the "
                                       "installed suites hold the code only")
        for item in items:
            if item.get_closest_marker("checkout"):
                item.add_marker(skip)


def pytest_collection_finish(session):
    """The third-party stacks the selected tests run (a test id naming one: its file or its parameter) are imported
    once by this process's fork server, not by each rank (``harness.runtime.spawn.preload_stacks``: CPU-only torch)."""
    from harness.runtime.preload import named_in
    from harness.runtime.spawn import preload_stacks

    preload_stacks(named_in(item.nodeid for item in session.items))


def yours_alone(config) -> bool:
    """Whether ``--impl`` is given and names no built-in implementation (only a user's: ``package.module:object``
    or an entry point)."""
    from harness.records.registry import BUILTINS

    specs = config.getoption("--impl", default=[]) or []
    return bool(specs) and not any(spec == name for spec in specs for _, name in BUILTINS)


def takes_an_impl(item) -> bool:
    """Whether a test is parametrised over implementations (a ``<paradigm>_impl`` fixture): the tests --impl feeds."""
    return any(name.endswith("_impl") for name in getattr(item, "fixturenames", ()))


def in_checkout() -> bool:
    """Whether paritybench runs from a clone (tox.ini beside its packages), not an installed copy."""
    return (Path(__file__).resolve().parents[2] / "tox.ini").is_file()


def pytest_terminal_summary(terminalreporter, config):
    for spec in getattr(config, "_paritybench_unexercised", []):
        terminalreporter.write_line(
            f"paritybench: --impl {spec} was exercised by no test that ran (its suite was not selected, or every "
            "test of it was skipped or deselected); the session fails.", red=True)
    errors = config._paritybench_harness_errors
    if errors:
        terminalreporter.write_line(
            f"paritybench: {len(errors)} harness error(s) — bugs of paritybench, not of the implementations "
            f"under test: {', '.join(errors)}", red=True)
    seconds = config._paritybench_seconds
    if seconds and not hasattr(config, "workerinput"):
        times = ", ".join(f"{suite} {t:.0f} s" for suite, t in sorted(seconds.items(), key=lambda kv: -kv[1]))
        workers = getattr(config.option, "numprocesses", None) or 0  # pytest-xdist's -n (0 or absent: none)
        over = f" (each test's own seconds, summed over {workers} workers running side by side)" if workers else ""
        terminalreporter.write_line(f"paritybench: time per suite{over}: {times}.")
    cache = getattr(config, "_paritybench_worlds", None)
    spawns = dict(config._paritybench_spawns)
    for n, k in (cache.spawns.items() if cache is not None else ()):
        spawns[n] = spawns.get(n, 0) + k
    if spawns:
        spawned = ", ".join(f"size {n}: {k}" for n, k in sorted(spawns.items()))
        terminalreporter.write_line(f"paritybench: Worlds spawned ({spawned}).")
