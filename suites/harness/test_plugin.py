"""The pytest plugin's options, as a user passes them: --impl SPEC selects implementations; bad values
are a usage error in one sentence."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.checkout  # reads the clone's files or runs its tools

ROOT = Path(__file__).resolve().parents[2]


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PARITYBENCH_HYPOTHESIS_PROFILE": "dev"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_impl_option_runs_a_users_implementation_only():
    out = pytest_run("suites/collectives/test_conformance.py", "suites/pipeline/test_equivalence.py",
                     "--collect-only", "--impl", "suites.collectives.impls:ring_unpipelined", "--impl", "torch",
                     "-k", "test_collective_matches or test_pipelined")
    assert out.returncode == 0, out.stdout + out.stderr
    ids = [line for line in out.stdout.splitlines() if "[" in line]
    collectives = [i for i in ids if "test_collective_matches_exact_oracle[" in i]
    pipelines = [i for i in ids if "test_pipelined_training_equals_one_device[" in i]
    # Each suite takes the specs of its own paradigm: the user's collectives and torch's, torch's pipeline.
    assert len(collectives) == 12 and len(pipelines) == 7, ids  # torch's pipeline: every schedule of GENERATORS
    assert all("ring_unpipelined-" in i or "[torch-" in i for i in collectives)
    assert all("[torch-" in i for i in pipelines)


def test_impl_naming_only_yours_leaves_out_the_suites_own_checks():
    """``pytest suites/stack --impl yours``: the tests that take an implementation, each with yours — not the
    planted bugs, the built-in stacks' own cases or the case lists' coverage (which no --impl changes); with a
    built-in name among the specs nothing is left out (the rule's reading of the specs: the test below)."""
    yours = pytest_run("suites/stack", "--collect-only", "--impl", "docs.examples.ddp_stack:DDPStack")
    assert yours.returncode == 0, yours.stdout + yours.stderr
    ids = [line for line in yours.stdout.splitlines() if "::" in line]
    assert ids and all("[docs.examples.ddp_stack:DDPStack" in i for i in ids), ids[:5]
    assert "deselected" in yours.stdout.splitlines()[-1]


def test_only_specs_of_your_own_leave_the_suites_own_checks_out():
    """``harness.pytest.session.yours_alone``, what the collection rule above reads: a user's spec alone (or an entry
    point's name) leaves the suite's own checks out; a built-in name beside it, or no --impl, leaves nothing out (in
    process: this was a second pytest session of ~5 s in tox)."""
    from types import SimpleNamespace

    from harness.pytest.session import yours_alone

    def given(*specs):
        return SimpleNamespace(getoption=lambda name, default=None: list(specs) if name == "--impl" else default)

    assert yours_alone(given("docs.examples.ddp_stack:DDPStack"))
    assert yours_alone(given("docs.examples.ddp_stack:DDPStack", "some-entry-point"))
    assert not yours_alone(given("docs.examples.ddp_stack:DDPStack", "reference"))
    assert not yours_alone(given("torch")) and not yours_alone(given())


def test_impl_option_runs_and_passes_on_the_world():
    out = pytest_run("suites/collectives/test_conformance.py", "--world-sizes", "2,3", "--impl",
                     "suites.collectives.impls:ring_unpipelined", "-k", "test_collective_matches and all_gather")
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    # one process (no -n): each suite's seconds are wall seconds, said plainly (under -n: suites/gate/test_xdist.py)
    assert "\nparitybench: time per suite: collectives " in out.stdout, out.stdout[-2000:]


@pytest.mark.thorough  # each a pytest session of its own (~2-7 s under tox's load); their messages are tested in
# process in tox (test_registry's --impl refusal; test_cli's --world-sizes rows, the same parser), this the path to
# pytest's exit code 4
@pytest.mark.parametrize("args, needle", [
    (["--impl", "nccl-magic"], "unknown implementation 'nccl-magic'"),
    (["--world-sizes", "0,2"], "every world size must be at least 1"),
    (["--world-sizes", "two"], "must be comma-separated whole numbers"),
], ids=["impl", "world-size-0", "world-size-word"])
def test_bad_options_are_usage_errors(args, needle):
    out = pytest_run("suites/collectives/test_bad_input.py", *args)
    assert out.returncode == 4 and needle in out.stderr, (args, out.stderr[-1000:])


@pytest.mark.thorough  # tox's budget (6 s: two pytest sessions); the plugin's other session rules run in tox
def test_an_impl_that_no_test_exercised_fails_the_session():
    """--impl names a checkpointing implementation, but only the cost-model suite is selected: nothing ran
    for it, and the session says so in one sentence and fails; with its suite selected it passes."""
    spec = "docs.examples.per_layer_checkpointing:PerLayerCheckpointing"
    out = pytest_run("suites/cost_model/test_memory.py", "--impl", spec)
    assert out.returncode == 1, out.stdout[-2000:]
    assert f"paritybench: --impl {spec} was exercised by no test that ran" in out.stdout
    out = pytest_run("suites/checkpoint/test_equivalence.py", "--impl", spec, "-k", "bitwise")
    assert out.returncode == 0 and "exercised by no test" not in out.stdout, out.stdout[-2000:]


def test_a_harness_error_is_named_as_ours_in_the_summary(tmp_path):
    test = tmp_path / "test_oracle_bug.py"
    test.write_text("from harness.errors import HarnessError\n\n"
                    "def test_oracle():\n    raise HarnessError('expected() has no float8 branch')\n\n"
                    "def test_implementation():\n    assert 1 == 2, 'the implementation got it wrong'\n")
    out = pytest_run(str(test), "--rootdir", str(ROOT), "-p", "harness.pytest.plugin")
    assert out.returncode == 1
    summary = [line for line in out.stdout.splitlines() if "harness error(s)" in line]
    assert len(summary) == 1 and summary[0].startswith(  # the implementation's plain failure is not listed
        "paritybench: 1 harness error(s) — bugs of paritybench, not of the implementations under test: ")
    assert summary[0].endswith("::test_oracle"), out.stdout[-1500:]


@pytest.mark.thorough  # two pytest sessions (~10 s under tox's load): the split's rule is held in tox in process
# (test_a_sweep_takes_tox_rows_except_where_the_run_follows_tox); this, end to end, in CI's thorough step
def test_thorough_sweeps_run_only_in_the_thorough_env(tmp_path):
    """A thorough case runs only there; a table that widens there (the ``sweep`` fixture) runs its tox rows in tox,
    and ``-m thorough`` (CI's step after tox) selects it with the thorough cases and runs the rest of its rows alone
    — not the rows tox ran. A test taking the ``thorough`` fixture runs in both, told which run it is in."""
    test = tmp_path / "test_sweep.py"
    test.write_text("import pytest\n\ndef test_tox():\n    print('RAN tox')\n\n"
                    "@pytest.mark.thorough\ndef test_larger_sweep():\n    print('RAN larger')\n\n"
                    "def test_widening_table(sweep):\n"
                    "    print('RAN rows', sweep.rows([1, 2, 3, 4], lambda n: n <= 2, 'thorough: 3 and 4'))\n\n"
                    "def test_a_tox_row(sweep):\n    sweep.require(True, 'never')\n    print('RAN tox row')\n\n"
                    "def test_a_wider_row(sweep):\n    sweep.require(False, 'thorough: wider')\n"
                    "    print('RAN wider row')\n\n"
                    "def test_thorough_fixture(thorough):\n    print('RAN thorough', thorough)\n")
    args = (str(test), "--rootdir", str(ROOT), "-p", "harness.pytest.plugin", "-s", "-rs")
    tox = pytest_run(*args).stdout
    ran = sorted(re.findall(r"RAN [\w\[\], ]+", tox))  # -s: after the progress dots
    assert ran == ["RAN rows [1, 2]", "RAN thorough False", "RAN tox", "RAN tox row"] and "thorough: wider" in tox, tox
    thorough = pytest_run(*args, "-m", "thorough").stdout
    ran = sorted(re.findall(r"RAN [\w\[\], ]+", thorough))
    assert ran == ["RAN larger", "RAN rows [3, 4]", "RAN thorough True", "RAN wider row"], thorough
    assert "ran in tox" in thorough, thorough


@pytest.mark.parametrize("markexpr, profile, tox_rows, wider", [
    ("", "ci", True, False), ("thorough", "ci", False, True), ("thorough or benchmark", "ci", False, True),
    ("not thorough", "ci", True, False), ("", "thorough", True, True), ("thorough", "thorough", False, True),
    ("thorough and not slow", "ci", True, True)])
def test_a_sweep_takes_tox_rows_except_where_the_run_follows_tox(markexpr, profile, tox_rows, wider, monkeypatch):
    """Tox takes a widening table's tox rows, ``tox -e thorough`` every row, ``-m thorough`` the rest alone; an
    expression it cannot read as "thorough cases only" (``and``, ``not``) takes the tox rows too: twice, never none."""
    from types import SimpleNamespace

    from harness.pytest.session import Sweep

    monkeypatch.setenv("PARITYBENCH_HYPOTHESIS_PROFILE", profile)
    assert Sweep.of(SimpleNamespace(getoption=lambda name, default=None: markexpr)) == Sweep(tox_rows, wider)


@pytest.mark.skipif(not (ROOT / ".ci" / "run").is_file(), reason="an installed paritybench has no .ci/run")
def test_ci_runs_the_cases_tox_leaves_to_the_thorough_env():
    """What tox deselects for its 10 minutes (marker ``thorough``) still runs on every CI run: ``.ci/run`` selects it
    in the env tox built, under the derandomized ci profile (the same examples every run; the nightly thorough env
    draws fresh ones)."""
    commands = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    steps = [line for line in commands.splitlines() if "-m pytest" in line and re.search(r"-m thorough\b", line)]
    assert len(steps) == 1, steps
    assert steps[0].startswith("PARITYBENCH_HYPOTHESIS_PROFILE=ci ") and ".tox/cpu/bin/python" in steps[0], steps[0]


@pytest.mark.parametrize("markexpr, profile, larger", [
    ("", "ci", False), ("thorough", "ci", True), ("thorough or benchmark", "ci", True), ("not thorough", "ci", False),
    ("benchmark and not (thorough)", "ci", False), ("", "thorough", True), ("not thorough", "thorough", True)])
def test_a_run_takes_the_larger_sweeps_when_its_marker_expression_selects_them(markexpr, profile, larger, monkeypatch):
    """``-m "not thorough"`` asks for tox's selection (its tables' corners), not the larger sweeps; the thorough
    profile takes them whatever the expression."""
    from types import SimpleNamespace

    from harness.pytest.session import thorough_run

    monkeypatch.setenv("PARITYBENCH_HYPOTHESIS_PROFILE", profile)
    assert thorough_run(SimpleNamespace(getoption=lambda name, default=None: markexpr)) is larger
