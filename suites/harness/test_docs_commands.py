"""Every ``paritybench`` command the docs and the README show — in a code block or inline — and the CLI module's own
synopsis (``harness/cli/main.py``'s docstring) names a command (and, for ``bench``, a suite) the CLI has, and every
``--option`` written after it is one that command's ``--help`` lists: a user copies these lines, and a renamed or
dropped option would leave the page saying what the CLI refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli.main import main

pytestmark = pytest.mark.checkout  # reads the clone's docs

ROOT = Path(__file__).resolve().parents[2]
_FENCED = re.compile(r"```[a-z]*\n(.*?)```", re.S)
_COMMAND = re.compile(r"(?:^|\s)paritybench ([a-z_0-9]+)(?=\s|$)([^#]*)")  # a comment after '#' is prose
_OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


def mentions(text: str) -> list[tuple[list[str], list[str]]]:
    """(the command's words — ``bench`` with its suite —, the options written after it) of each ``paritybench``
    command in ``text``'s code: fenced blocks line by line, then inline code spans."""
    spans = [line for block in _FENCED.findall(text) for line in block.splitlines()]
    spans += re.findall(r"`([^`\n]+)`", _FENCED.sub("", text))
    out = []
    for span in spans:
        for m in _COMMAND.finditer(span):
            rest = m[2].split()
            words = [m[1], rest[0]] if m[1] == "bench" and rest and re.fullmatch(r"[a-z_0-9]+", rest[0]) else [m[1]]
            out.append((words, _OPTION.findall(m[2])))
    return out


def _help(words: list[str], capsys, cache: dict) -> str | None:
    """The command's ``--help``, or None where the CLI has no such command (its one sentence, exit 2)."""
    key = tuple(words)
    if key not in cache:
        try:
            code = main([*words, "--help"])  # ``test`` prints its own and returns 0
        except SystemExit as exc:  # argparse's --help exits 0 after printing
            code = exc.code
        cache[key] = capsys.readouterr().out if code in (0, None) else None
    return cache[key]


def test_the_reader_finds_commands_and_their_options():
    text = ("Run `paritybench bench zero --stages 0,1` or\n```\nparitybench plan --params 7B --dp 8"
            "   # --not-an-option\n```\nthe `paritybench in-rank time` is prose.")
    assert mentions(text) == [(["plan"], ["--params", "--dp"]), (["bench", "zero"], ["--stages"])]


def test_every_option_the_docs_show_is_the_clis(capsys):
    from harness.cli import main as cli

    texts = {page.relative_to(ROOT).as_posix(): page.read_text()
             for page in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]}
    texts["harness/cli/main.py"] = f"```\n{cli.__doc__}```"  # its synopsis: one code block
    cache: dict = {}
    seen, wrong = 0, []
    for page, text in texts.items():
        for words, options in mentions(text):
            usage = _help(words, capsys, cache)
            if usage is None:
                wrong.append((page, " ".join(words), "no such command"))
                continue
            for option in options:
                seen += 1
                if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", usage):
                    wrong.append((page, " ".join(words), option))
    assert seen > 50, f"only {seen} options read from the docs: the reader no longer finds their commands"
    assert not wrong, wrong


def test_bench_all_is_documented_as_the_sweeps_it_runs():
    """docs/commands.md's ``bench all`` line lists exactly the sweeps ``bench all`` runs, in its order (muon was
    missing from it)."""
    from harness.cli.bench import _chosen

    text = (ROOT / "docs" / "commands.md").read_text()
    line = re.search(r"^paritybench bench all +# ([a-z_, ]+):", text, re.M)
    assert line, "docs/commands.md has no bench all line with its sweeps"
    assert [w.strip() for w in line[1].split(",")] == _chosen("all")


def test_the_iteration_defaults_the_docs_state_are_the_records():
    """docs/commands.md's "`name` iters / warmup" list is each bench's record (``Bench.iters`` / ``warmup``: its
    own command's default and its bound under ``bench all``), and every record off 10 / 3 is in it."""
    from harness.paradigm import benches

    text = re.sub(r"\s+", " ", (ROOT / "docs" / "commands.md").read_text())
    stated = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r"`([a-z0-9_]+)` (\d+) / (\d+)", text)}
    records = {name: (b.iters, b.warmup) for name, b in benches().items()}
    assert stated == {name: c for name, c in records.items() if c != (10, 3)}, (stated, records)
    assert "the others 10 / 3" in text
