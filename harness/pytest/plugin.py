"""The pytest plugin: shared Worlds, implementation parametrisation, hypothesis profiles, results.

Options:
  --world-sizes 1,2,3,4   world sizes properties draw from (a non-power of two catches chunking bugs)
  --backend gloo|nccl     default: nccl with one GPU per rank, else gloo
  --impl SPEC             implementation(s) to test (repeatable; default: every registered one)
  --results-dir DIR       also write a run folder with a conformance row per executed example

Fixtures: ``world_cache`` (session: one World per (size, backend), spawned on first use, closed at the
end), ``world_sizes``, ``world`` (parametrised over --world-sizes), ``collectives_impl`` and
``pipeline_impl`` (parametrised over the implementations of that paradigm among --impl, or every
registered one; skipped with a reason where a package is missing), ``conformance`` (records
rows), ``stack_case`` (holds a stack to one device on a case of your own), ``thorough`` and ``sweep`` (whether
the run takes the larger sweeps; which rows of a table that widens there). A test that also takes
``collective_name`` is parametrised over (implementation, collective) pairs, leaving out variants where
they share the collective with another implementation. Worlds are never spawned per test or per example.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from harness.cli.parsing import parse_world_sizes
from harness.collectives.case import COLLECTIVES
from harness.contracts import CONTRACTS
from harness.errors import UsageError
from harness.records import findings, registry
from harness.runtime import placement
from harness.runtime.world import World, default_backend

pytest_plugins = ["harness.pytest.session"]  # the summary, the accounting, pytest-xdist, benchmark opt-in

# The World fixtures are session-cached and safe to reuse across examples.
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=_SUPPRESS)
# ci: 100 random examples per property after its fixed corner table (world size 3, numel 0/1/<N/prime, ...), the
# same ones every run (derandomized); the thorough env draws 500 fresh ones. 150 until 2026-12-06: tox's budget (the
# hypothesis-driven files took 127 s of tox's wall time at 150, 105 s at 100, measured back to back)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=_SUPPRESS)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=_SUPPRESS)
settings.load_profile(os.environ.get("PARITYBENCH_HYPOTHESIS_PROFILE", "dev"))


def pytest_addoption(parser):
    group = parser.getgroup("paritybench")
    group.addoption("--world-sizes", default="auto",
                    help="comma-separated world sizes, or auto (default): 1,2,3,4 on CPU; on a GPU node 1, 2, 3, "
                         "the powers of two up to the GPU count and the count; under torchrun the job's size")
    group.addoption("--backend", default=None, choices=["gloo", "nccl"], help="default: automatic")
    group.addoption("--impl", action="append", default=[], metavar="SPEC",
                    help="implementation to test: a registered name or package.module:object (repeatable)")
    group.addoption("--results-dir", default=None, help="write a run folder with conformance rows here")


def _world_sizes(config) -> list[int]:
    """--world-sizes, sorted and without repeats; ``auto``: 1,2,3,4 on CPU (see ``parsing.auto_world_sizes``)."""
    try:
        return sorted(set(parse_world_sizes(config.getoption("--world-sizes"), config.getoption("--backend"),
                                            "1,2,3,4")))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def _refusal(spec: str, paradigm: str) -> registry.RegistryError | None:
    """None if ``spec`` names a ``paradigm`` implementation (one that can be skipped counts), else why not."""
    try:
        impl = registry.resolve(spec, paradigm)
        if registry.skip_reason(impl) is None:
            registry.load(spec, paradigm)
    except registry.RegistryError as exc:
        return exc
    return None


def _fits(spec: str, paradigm: str) -> str | None:
    refusal = _refusal(spec, paradigm)
    return None if refusal is None else str(refusal)


def _no_paradigm(spec: str, refusals: list[registry.RegistryError]) -> str:
    """Why ``spec`` (which no paradigm takes) is refused, for the paradigm it was meant for: an unknown name is told
    every registered one; an object, the refusal of the contract whose methods it has the most of (a user's
    collectives lacking all_to_all is told that, not the first paradigm's missing method)."""
    if ":" not in registry.current_name(spec) and all(
            str(r).startswith(f"unknown implementation {spec!r}") for r in refusals):
        known = dict.fromkeys(name for paradigm in CONTRACTS for name in registry.names(paradigm))
        return f"unknown implementation {spec!r}; known: {', '.join(known)}, or package.module:object for your own."
    return str(max(refusals, key=lambda r: getattr(r, "has", -1)))  # max: the first of the nearest


def _impl_specs(config, paradigm: str) -> list[str]:
    """--impl's specs that are ``paradigm`` implementations (each suite takes its own), else every registered one."""
    specs = config.getoption("--impl")
    return [s for s in specs if _fits(s, paradigm) is None] if specs else registry.names(paradigm)


def pytest_configure(config):
    config.addinivalue_line("markers", "world: the test runs ranks on a World")
    config.addinivalue_line("markers", "checkout: needs a clone of paritybench (docs/, tox.ini): skipped when the "
                                       "suites run installed")
    config.addinivalue_line("markers", "benchmark: a pytest-benchmark test (opt in: -m benchmark or --benchmark-only)")
    config.addinivalue_line("markers", "paritybench_smoke: the benchmark test that also runs by default")
    config.addinivalue_line("markers", "thorough: part of a larger sweep, run by `tox -e thorough` (the thorough "
                            "hypothesis profile) or -m thorough (CI's step after tox); deselected otherwise")
    _world_sizes(config)
    for spec in config.getoption("--impl"):
        refusals = [_refusal(spec, paradigm) for paradigm in CONTRACTS]
        if all(refusals):
            raise pytest.UsageError(_no_paradigm(spec, refusals))
    config._paritybench_run = None
    config._paritybench_exercised = set()
    config._paritybench_seconds = {}
    config._paritybench_harness_errors = []
    config._paritybench_spawns = {}
    results_dir = config.getoption("--results-dir")
    shared = getattr(config, "workerinput", {}).get("paritybench_run")
    if shared:  # a pytest-xdist worker: rows go into the controller's run folder
        from harness.records.results import RunDir

        config._paritybench_run = RunDir.attach(*shared)
    elif results_dir and not hasattr(config, "workerinput"):
        from harness.records.results import ResultsError, RunDir

        try:
            config._paritybench_run = RunDir(results_dir, {"suite": "pytest", "world_sizes": _world_sizes(config)})
            config._paritybench_run.create_files()  # headers now: xdist workers append to the same files
        except ResultsError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_unconfigure(config):
    run = getattr(config, "_paritybench_run", None)
    if run is not None and not run.attached:
        run.finish("complete")


def pytest_generate_tests(metafunc):
    from harness.paradigm import paradigms

    for paradigm in (p.name for p in paradigms() if p.contract and p.name != "collectives"):
        if f"{paradigm}_impl" in metafunc.fixturenames:
            params = []
            for spec in _impl_specs(metafunc.config, paradigm):
                reason = registry.skip_reason(registry.resolve(spec, paradigm))
                params.append(pytest.param(spec, id=spec, marks=[pytest.mark.skip(reason=reason)] if reason else []))
            metafunc.parametrize(f"{paradigm}_impl", params)
    if "world" in metafunc.fixturenames:
        metafunc.parametrize("world_size", _world_sizes(metafunc.config), indirect=False, scope="session")
    if "collectives_impl" in metafunc.fixturenames:
        ops = COLLECTIVES if "collective_name" in metafunc.fixturenames else (None,)
        params = []
        for spec in _impl_specs(metafunc.config, "collectives"):
            impl = registry.resolve(spec, "collectives")
            reason = registry.skip_reason(impl)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            for op in ops:
                if op is None:
                    params.append(pytest.param(spec, id=spec, marks=marks))
                elif impl.owns(op):  # variants: only where they differ
                    params.append(pytest.param(spec, op, id=f"{spec}-{op}", marks=marks))
        names = "collectives_impl" if ops == (None,) else "collectives_impl,collective_name"
        metafunc.parametrize(names, params)


class WorldCache:
    """One World per (size, backend) for the whole session; each new World's placement goes to ``run``."""

    def __init__(self, backend: str | None, run=None):
        self.backend, self.run = backend, run
        self._worlds: dict[tuple[int, str], World] = {}
        self.spawns: dict[int, int] = {}
        """World size -> how many times a World of that size was spawned (respawns follow failed calls)."""

    def get(self, size: int) -> World:
        backend = self.backend or default_backend(size)
        key = (size, backend)
        if key not in self._worlds:
            self._worlds[key] = World(size, backend=backend, timeout=120)
            placement.record(self.run, self._worlds[key])
        return self._worlds[key]

    def close(self) -> None:
        for world in self._worlds.values():
            world.close()
            self.spawns[world.size] = self.spawns.get(world.size, 0) + world.spawn_count
        self._worlds.clear()


@pytest.fixture(scope="session")
def world_cache(request):
    cache = WorldCache(request.config.getoption("--backend"), request.config._paritybench_run)
    request.config._paritybench_worlds = cache
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def world_sizes(request) -> list[int]:
    return _world_sizes(request.config)


@pytest.fixture(scope="session")
def thorough(request) -> bool:
    """Whether this run takes the larger sweeps (``tox -e thorough``, ``-m thorough``): for a test whose table
    runs its corners in every profile and the rest of its rows there."""
    from harness.pytest.session import thorough_run

    return thorough_run(request.config)


@pytest.fixture(scope="session")
def sweep(request):
    """What of a widening table this run takes (``harness.pytest.session.Sweep``): ``sweep.rows(rows, in_tox, why)``,
    ``sweep.require(in_tox, why)`` — tox its tox rows, the thorough env all, ``-m thorough`` the rest alone."""
    from harness.pytest.session import Sweep

    return Sweep.of(request.config)


@pytest.fixture
def world(world_cache, world_size) -> World:
    return world_cache.get(world_size)


class Conformance:
    """Records one conformance row per executed example into the run folder (if --results-dir), and the
    known findings (harness/records/findings.py) that examples hit, for ``settle``."""

    def __init__(self, run, property_name: str, strict: bool = False):
        self.run, self.property, self.strict = run, property_name, strict
        self.counts: dict[str, int] = {}
        self.known: list = []

    def record(self, outcome: str, finding=None, **row) -> None:
        """One executed example; ``finding``: the registry's finding that explains a failed example."""
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if finding is not None:
            self.known.append(finding)
            row["detail"] = findings.detail_with(finding, row.get("detail"))
        if self.run is not None:
            self.run.append("conformance.csv", {"property": self.property, "outcome": outcome, **row})

    def settle(self) -> None:
        """After a property: examples that hit a known finding make the test xfail with the finding's reason
        (under ``pytest --strict``, fail): reported as what they are, never as a pass."""
        if not self.known:
            return
        reasons = sorted({f"{f.reason} (watch: {f.watch})" for f in self.known})
        message = f"{len(self.known)} example(s) hit a known finding: " + " ".join(reasons)
        if self.strict:
            pytest.fail(message + " [--strict counts known findings as failures]", pytrace=False)
        pytest.xfail(message)


def strict_mode(config) -> bool:
    """pytest's own ``--strict`` (ini ``strict``, pytest >= 9); it also makes known findings failures."""
    try:
        return bool(config.getini("strict"))
    except ValueError:  # an older pytest without the ini option
        return False


@pytest.fixture
def conformance(request) -> Conformance:
    return Conformance(request.config._paritybench_run, request.node.name, strict_mode(request.config))


@pytest.fixture
def stack_case(world_cache, conformance):
    """Hold a stack to one device on your own case: ``stack_case(impl, spec, layout, recipe, padded=False)`` ->
    {"outcome": pass / fail / unsupported / refused / known-nonconformance, "problems": [one line each],
    "refused": its sentence, ...} — trained on the session's World of ``layout.world_size`` ranks (spawned once),
    recorded as a conformance row (docs/contracts/stack.md, "Your own case")."""
    from harness.stack.judge import hold

    def case(impl: str, spec, layout, recipe, **kw) -> dict:
        return hold(world_cache, conformance, impl, layout.world_size, spec, layout, recipe, **kw)
    return case
