"""The stacks' release matrix (harness/records/release_matrix.py): its table, one run folder of every (stack, release),
a release that cannot install a row of its own, and a report whose matrix has a column per stack and release.
The venvs and pytest sessions themselves are the nightly env's (``tox -e stacks-matrix``); here they are stubbed."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records import release_matrix as rm
from harness.records.results import RunDir, read_run


def test_every_stack_has_its_newest_release_last_and_a_distribution():
    for stack, spec in rm.MATRIX.items():
        releases = [tuple(map(int, r.split("."))) for r in spec["releases"]]
        assert releases == sorted(releases) and len(set(releases)) == len(releases), stack
        assert spec["dist"] and spec["key"], stack


def test_an_unknown_stack_is_one_sentence_and_exit_2(capsys):
    assert rm.main(["--stacks", "deepspeed,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err


def _fake_session(venv, spec, results: Path) -> int:
    run = RunDir(results, {"suite": "pytest"})
    run.append("conformance.csv", {"suite": "stack", "impl": spec["key"], "world_size": 2, "dtype": "float32",
                                   "property": "test_x[a]", "collective": "llama/2x1x1/zero1/1f1b",
                                   "outcome": "pass" if venv.name.endswith("new") else "fail", "detail": "d"})
    run.finish()
    return 0


def test_one_run_folder_holds_every_release_and_a_release_that_does_not_install(tmp_path, monkeypatch):
    monkeypatch.setitem(rm.MATRIX, "fake", {"dist": "fake-dist", "releases": ["1.0.0", "2.0.0"], "key": "fake",
                                            "extra": []})
    installed = {}

    def install(venv, spec, release):
        installed["now"] = release
        return "ERROR: No matching distribution found for fake-dist==1.0.0" if release == "1.0.0" else None

    monkeypatch.setattr(rm, "_venv", lambda venvs, stack, python=None: tmp_path / "venv-new")
    monkeypatch.setattr(rm, "_install", install)
    monkeypatch.setattr(rm, "_not_driven", lambda venv, spec: None)
    monkeypatch.setattr(rm, "_session", _fake_session)
    path = rm.run(["fake"], tmp_path / "out", tmp_path / "venvs")
    meta, frames = read_run(path)
    rows = frames["conformance.csv"]
    assert meta["status"] == "complete" and meta["matrix"] == {"fake": ["1.0.0", "2.0.0"]}
    assert sorted(zip(rows["release"].astype(str), rows["outcome"], strict=True)) == \
        [("1.0.0", "unsupported"), ("2.0.0", "pass")]
    assert "No matching distribution" in rows[rows["release"].astype(str) == "1.0.0"]["detail"].iloc[0]


def test_the_matrix_has_a_column_per_release_where_a_run_holds_several(tmp_path):
    from harness.cli.report import write_report

    run = RunDir(tmp_path, {"suite": "stacks-matrix"})
    for release, outcome in (("0.18.9", "fail"), ("0.19.8", "pass")):
        run.append("conformance.csv", {"suite": "stack", "impl": "deepspeed", "release": release, "world_size": 2,
                                       "dtype": "float32", "property": "test_deepspeed_equals_one_device[x]",
                                       "collective": "llama/2x1x1/zero1/1f1b", "outcome": outcome, "detail": "why"})
    run.finish()
    text = Path(write_report(str(run.path))).read_text()
    header = next(line for line in text.splitlines() if "deepspeed 0.18.9" in line)
    assert "deepspeed 0.19.8" in header, header


@pytest.mark.parametrize("stack", sorted(rm.MATRIX))
def test_the_key_selects_the_stacks_own_tests(stack):
    """-k <key> must match test ids of the stack's own files (a key that matched nothing would run nothing)."""
    files = {"deepspeed": "suites/stack/test_deepspeed.py", "megatron": "suites/stack/test_megatron.py",
             "torchtitan": "suites/stack/test_torchtitan.py", "accelerate": "suites/stack/test_accelerate.py",
             "transformers": "suites/expert_parallel/test_transformers_ep.py"}
    assert rm.MATRIX[stack]["key"] in Path(rm.ROOT / files[stack]).name


def test_a_release_that_imports_more_gets_those_packages_with_their_dependencies(tmp_path, monkeypatch):
    """torchtitan is installed without its dependencies (its data stack is not the trainer's), but 0.2.2's llama3
    package imports datasets, torchdata and tensorboard: for that release alone a second pip call resolves them,
    torch pinned."""
    calls = []

    class Done:
        returncode, stderr = 0, ""

    monkeypatch.setattr(rm, "_pip", lambda venv, *args: calls.append(args) or Done())
    assert rm._install(tmp_path, rm.MATRIX["torchtitan"], "0.3.0") is None
    assert len(calls) == 1 and "--no-deps" in calls[0]
    calls.clear()
    assert rm._install(tmp_path, rm.MATRIX["torchtitan"], "0.2.2") is None
    assert len(calls) == 2 and "--no-deps" not in calls[1] and {"datasets", rm.TORCH} <= set(calls[1])
