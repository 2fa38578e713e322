"""``paritybench test [PARADIGM ...] --impl SPEC [pytest args]``: the installed suites, run by pytest.

The suites ship in the distribution (package ``suites``); this command is ``pytest --pyargs
suites.<paradigm> ...`` with paritybench's plugin, from wherever the user stands (their own repository,
their CI). Without a paradigm every paradigm suite runs. What follows the paradigms goes to pytest as it
is (``--impl``, ``--world-sizes``, ``--results-dir``, ``-k``, ``-x`` ...).
"""

from __future__ import annotations

from harness.errors import UsageError

PARADIGMS = ("collectives", "pipeline", "tensor_parallel", "zero", "checkpoint", "stack", "context_parallel",
             "expert_parallel", "threed", "mixed_precision", "resume")
"""The suites a user runs against an implementation (``suites.<name>``); the others test paritybench."""


def add_parser(sub) -> None:
    t = sub.add_parser("test", help="run the installed suites with pytest (paradigms, then pytest's arguments)",
                       add_help=False)
    t.add_argument("args", nargs="*", metavar="[PARADIGM ...] [pytest args]")


def pytest_args(argv: list[str]) -> list[str]:
    """The pytest command line for ``paritybench test ARGV``: leading words that name paradigms become
    ``--pyargs suites.<paradigm>``; a leading word that looks like a paradigm but is none is bad input."""
    paradigms, rest = [], list(argv)
    while rest and not rest[0].startswith("-"):
        word = rest.pop(0)
        if word not in PARADIGMS:
            raise UsageError(f"'{word}' is not a paradigm suite; paritybench test takes any of "
                             f"{', '.join(PARADIGMS)} before pytest's own arguments.")
        paradigms.append(word)
    return ["--pyargs", *[f"suites.{p}" for p in paradigms or PARADIGMS], *rest]


def run(argv: list[str]) -> int:
    import pytest

    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        print(f"\nparadigms: {', '.join(PARADIGMS)}")
        return 0
    plugins = [] if _plugin_loaded() else ["harness.pytest.plugin"]
    # harness is imported already (this command): pytest cannot rewrite its asserts, and need not
    quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    return int(pytest.main([*pytest_args(argv), *[a for p in plugins for a in ("-p", p)], *quiet]))


def _plugin_loaded() -> bool:
    """Whether pytest will load paritybench's plugin by itself (its ``pytest11`` entry point, installed)."""
    from importlib.metadata import entry_points

    return any(ep.value == "harness.pytest.plugin" for ep in entry_points(group="pytest11"))
