"""The registry of implementations: built-in names, entry points, and ``package.module:object`` specs.

A spec names an implementation in three ways:

- a built-in name (``reference``, ``reference-rhd``, ``torch``, ...);
- a name registered by another package under the entry-point group ``paritybench.implementations``;
- ``package.module:object`` — an object importable from the user's own code.

The object is an implementation (it satisfies the paradigm's contract), or a class / zero-argument
factory that returns one. Specs are resolved on the driver (to fail early, in one sentence) and loaded
again inside each rank process (``load``, cached per process).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import re
from dataclasses import dataclass, field

ENTRY_POINT_GROUP = "paritybench.implementations"
_SPEC_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class RegistryError(ValueError):
    """A spec that names no usable implementation; the message is one sentence for the user."""


class NotThisContract(RegistryError):
    """An object that is not the paradigm's implementation: ``has`` of the contract's methods are there (what the
    pytest plugin reads to name the paradigm a spec was nearest to)."""

    def __init__(self, message: str, has: int):
        super().__init__(message)
        self.has = has


@dataclass(frozen=True)
class ImplSpec:
    """How to build one implementation."""

    name: str
    """The name used on the command line and in results."""
    paradigm: str
    """The contract it satisfies, a key of ``harness.contracts.CONTRACTS``."""
    target: str
    """``module:object`` to import."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the object when it is a class or factory."""
    requires: tuple[str, ...] = ()
    """Packages that must be importable; when one is missing the implementation is skipped."""
    drives: dict = field(default_factory=dict)
    """distribution -> (the oldest release this adapter drives, what it drives): narrower than
    ``harness.records.releases.DRIVEN`` where one adapter drives fewer releases than the stack's (an older release is
    its skip reason, in that sentence)."""
    only_ops: tuple[str, ...] = ()
    """A variant that differs from another registered implementation only in these operations (the
    suites and benchmarks exercise it there only); empty: every operation is its own."""
    description: str = ""

    def owns(self, op: str) -> bool:
        """False for a variant that shares ``op`` with another implementation (nothing new to measure)."""
        return not self.only_ops or op in self.only_ops


def builtins() -> dict[tuple[str, str], ImplSpec]:
    """(paradigm, name) -> the built-in implementation: every paradigm record's ``builtins``."""
    from harness.paradigm import paradigms

    return {(spec.paradigm, spec.name): spec for p in paradigms() for spec in p.builtins}


def options() -> dict[tuple[str, str], str]:
    """(paradigm, spec) -> the built-in name its findings are registered under: a built-in stack under an option
    its users set (docs/guides/stacks.md), or a third party a suite holds directly rather than through a contract
    (transformers' expert parallelism, ``suites/expert_parallel/test_transformers_ep.py``) — every paradigm
    record's ``options``: the suite's own table (never read from the object). Not among the names every suite
    parametrises over: their own cases name them."""
    from harness.paradigm import paradigms

    return {(p.name, spec): name for p in paradigms() for spec, name in p.options}


def __getattr__(name: str):
    if name in ("BUILTINS", "OPTIONS", "CONTRACTS"):  # read from the paradigm records when asked
        from harness.paradigm import contracts

        return {"BUILTINS": builtins, "OPTIONS": options, "CONTRACTS": contracts}[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _entry_points() -> dict[str, ImplSpec]:
    """Implementations other packages register; their paradigm is checked when they are loaded."""
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {ep.name: ImplSpec(ep.name, "", ep.value, description="entry point") for ep in eps}


def names(paradigm: str) -> list[str]:
    """Every registered implementation name for ``paradigm`` (built-ins first)."""
    builtin = [name for (par, name) in builtins() if par == paradigm]
    return builtin + [n for n, s in _entry_points().items() if s.paradigm in ("", paradigm)]


def current_name(spec: str) -> str:
    """``spec`` with a moved module under its new name (``harness.adapters.deepspeed_stack:X`` ->
    ``harness.adapters.deepspeed.stack:X``); a registered name as it is."""
    from harness.moved import MOVED
    from reference.aliases import canonical

    return canonical(spec, MOVED) if ":" in spec else spec


def resolve(spec: str, paradigm: str) -> ImplSpec:
    """Turn a spec string into an ``ImplSpec``, or raise ``RegistryError`` saying what is valid. A spec naming a
    module under its old name (``harness.adapters.deepspeed_stack:CallerScalesLoss``) is read under its new one."""
    from harness.paradigm import contracts

    spec = current_name(spec)

    if paradigm not in contracts():
        raise RegistryError(f"unknown paradigm {paradigm!r}; known: {', '.join(contracts())}.")
    known = builtins()
    if (paradigm, spec) in known:
        return known[(paradigm, spec)]
    other = [par for (par, name) in known if name == spec]
    if other:
        raise RegistryError(f"implementation {spec!r} is a {' and '.join(other)} implementation, not {paradigm}; "
                            f"known for {paradigm}: {', '.join(names(paradigm))}.")
    entry = _entry_points().get(spec)
    if entry is not None:
        return ImplSpec(entry.name, paradigm, entry.target, description=entry.description)
    if ":" not in spec:
        raise RegistryError(
            f"unknown implementation {spec!r}; known for {paradigm}: {', '.join(names(paradigm))}, "
            "or package.module:object for your own.")
    if not _SPEC_RE.match(spec):
        raise RegistryError(f"malformed implementation {spec!r}: expected package.module:object, "
                            "e.g. mypkg.collectives:MyCollectives.")
    return ImplSpec(spec, paradigm, spec, description="user")


def skip_reason(impl: ImplSpec) -> str | None:
    """Why this implementation cannot run here (a required package is missing), or None."""
    for package in impl.requires:
        try:
            found = importlib.util.find_spec(package) is not None
        except ImportError:  # find_spec("a.b") imports "a", which raises where "a" is missing
            found = False
        except Exception as exc:  # noqa: BLE001 - a parent package that is installed but breaks on import
            return f"implementation {impl.name!r} needs the package {package!r}, which fails to import: {exc}"
        if not found:
            return f"implementation {impl.name!r} needs the package {package!r}, which is not installed"
    from harness.records.releases import not_driven

    return next(filter(None, (not_driven(package, impl.drives) for package in impl.requires)), None)


_LOADED: dict[tuple[str, str], object] = {}


def load(spec: str, paradigm: str):
    """The implementation object for ``spec``, built once per process; checked against the contract."""
    key = (spec, paradigm)
    if key not in _LOADED:
        impl = resolve(spec, paradigm)
        reason = skip_reason(impl)
        if reason:
            raise RegistryError(reason + ".")
        _LOADED[key] = _build(impl, paradigm)
    return _LOADED[key]


def _build(impl: ImplSpec, paradigm: str):
    module_name, _, attr = impl.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import module {module_name!r} for implementation {impl.name!r}: {exc}.") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (implementation {impl.name!r}).")
        obj = getattr(obj, part)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        try:
            obj = obj(**impl.kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever the user's factory raises, say so in one line
            raise RegistryError(f"could not build implementation {impl.name!r} from {impl.target!r} "
                                f"(it must be an implementation, a class or a zero-argument factory): {exc}.") from exc
    from harness.paradigm import contracts

    contract = contracts()[paradigm]
    methods = _methods(contract)
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise NotThisContract(f"{impl.name!r} is not a {paradigm} implementation: it lacks {', '.join(missing)}.",
                              has=len(methods) - len(missing))
    # Several contracts have one method of the same name (pipeline and zero: build); the arguments tell them apart.
    wrong = [m for m in methods if not _accepts(getattr(obj, m), getattr(contract, m))]
    if wrong:
        args = ", ".join(f"{m}({', '.join(_parameters(getattr(contract, m)))})" for m in wrong)
        raise NotThisContract(f"{impl.name!r} is not a {paradigm} implementation: it does not take {args}.",
                              has=len(methods) - len(wrong))
    return obj


def _parameters(contract_method) -> list[str]:
    return list(inspect.signature(contract_method).parameters)[1:]  # without self


def _accepts(method, contract_method) -> bool:
    """Whether ``method`` can be called with every argument of the contract's method, positionally."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin or C method: nothing to check
        return True
    try:
        signature.bind(*[None] * len(_parameters(contract_method)))
    except TypeError:
        return False
    return True


def _methods(contract) -> list[str]:
    return sorted(n for n, v in vars(contract).items() if inspect.isfunction(v) and not n.startswith("_"))


def check(spec: str, paradigm: str) -> ImplSpec:
    """Resolve and, unless it must be skipped, build once on the driver, so bad specs fail early."""
    impl = resolve(spec, paradigm)
    if skip_reason(impl) is None:
        load(spec, paradigm)
    return impl
