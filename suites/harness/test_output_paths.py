"""Every command's output option is checked before the command's work: a path that cannot be written is one sentence
and exit code 2 at once — not a traceback after a calibration sweep, a localisation or a comparison (before: each
wrote at its end, and `--out /tmp` or a path under a file raised IsADirectoryError / FileNotFoundError there)."""

from __future__ import annotations

import pytest

from harness.cli.main import main
from harness.cli.parsing import output_path
from harness.errors import UsageError

# (the command up to its output option, the option, whether it names a folder); the inputs after the option are
# never read: the output is checked first
COMMANDS = {
    "calibrate": (["calibrate", "--world-sizes", "2", "--out"], "--out", False),
    "calibrate-from": (["calibrate", "--from", "no-such-run", "--out"], "--out", False),
    "compare": (["compare", "no-such-run", "no-such-run", "--output"], "--output", False),
    "baseline": (["baseline", "no-such-run", "--out"], "--out", True),
    "schedule": (["schedule", "1f1b", "--p", "2", "--m", "2", "--png"], "--png", False),
    "localise": (["localise", "reference", "--layout", "1x1x1", "--steps", "1", "--out"], "--out", True),
}


def _bad(kind: str, tmp_path, folder: bool):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    if kind == "under a file":
        return blocker / "out", f"cannot be written: {str(blocker)!r} is a file, not a folder."
    if kind == "the other kind":  # an existing folder where a file is asked, an existing file where a folder is
        return (blocker, "is a file; give a folder.") if folder else (tmp_path, "is a folder; give the file to write.")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["under a file", "the other kind"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_that_cannot_be_written_is_one_sentence_before_the_work(command, kind, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # calibrate's run folder would land under ./results/runs
    head, option, folder = COMMANDS[command]
    path, needle = _bad(kind, tmp_path, folder)
    assert main([*head, str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"paritybench: error: {option} {str(path)!r} {needle}\n", err
    assert not (tmp_path / "results").exists()  # no sweep ran, no run folder was made


def test_a_folder_no_file_can_be_made_in_is_named_with_the_reason(tmp_path, monkeypatch):
    import tempfile

    def refused(*args, **kwargs):  # what a read-only mount or a folder without write permission answers
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    with pytest.raises(UsageError) as exc:
        output_path(str(tmp_path / "new" / "profile.json"), "--out")
    assert str(exc.value) == (f"--out {str(tmp_path / 'new' / 'profile.json')!r} cannot be written: no file can be "
                              f"made in {str(tmp_path)!r} (Permission denied).")


def test_a_writable_output_is_returned_and_nothing_is_left_behind(tmp_path):
    assert output_path(str(tmp_path / "new" / "sub" / "profile.json"), "--out") == tmp_path / "new" / "sub" / \
        "profile.json"
    assert output_path(str(tmp_path / "baseline"), "--out", folder=True) == tmp_path / "baseline"
    assert output_path(str(tmp_path), "--out", folder=True) == tmp_path  # an existing folder, for a folder
    assert list(tmp_path.iterdir()) == []  # the probe removed, no folder made


def test_schedule_png_lands_at_the_path_given(tmp_path, capsys):
    """matplotlib appends ".png" to a name without a suffix: the Gantt chart is written where --png says."""
    bare = tmp_path / "gantt"
    assert main(["schedule", "1f1b", "--p", "2", "--m", "2", "--png", str(bare)]) == 0
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "gantt.png").exists()
    assert f"wrote {bare}" in capsys.readouterr().out


@pytest.mark.parametrize("module, argv", [("harness.gate.study", ["collect", "--out"]),
                                          ("harness.records.release_matrix", ["--out"])])
def test_the_team_tools_check_their_output_folder_first(module, argv, tmp_path, capsys):
    """``python -m harness.gate.study collect`` (minutes of bench runs) and ``python -m harness.records.release_matrix``
    (a venv per release) say a bad --out at once."""
    import importlib

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert importlib.import_module(module).main([*argv, str(blocker)]) == 2
    assert capsys.readouterr().err == f"paritybench: error: --out {str(blocker)!r} is a file; give a folder.\n"
