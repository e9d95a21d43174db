"""Every `--help` reads as sentences in an 80-column terminal.

Each command's and subcommand's help is rendered at 80 columns, as a user's terminal shows
it. Each text of it (every paragraph of the command's description, its first paragraph in
its group's command list, every option's help) must appear whole, with line breaks only
where the terminal wraps: a line ends early only when the next word would not have fitted.
This fails a hard line break inside a docstring paragraph where the renderer keeps it
(typer's rich panels keep them in command lists and in later paragraphs), a command list's
summary cut short with "..." (click cuts a first paragraph longer than the list's width,
or one that holds a sentence's end, as "e.g." does), and a word or option name cut short
with an ellipsis (typer's rich option tables at 80 columns). Paragraphs marked with click's
``\\b`` are preformatted on purpose and are not checked. No line is wider than 80 columns.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.cells import cell_len

from rlpipe.cli.main import app

WIDTH = 80
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BORDER = "│"


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group below ``command``, with the words that name it."""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(typer.main.get_command(app)))


def _paragraphs(help_text: str | None) -> list[str]:
    """The prose paragraphs of a help text as typer shows them (up to a ``\\f``), without the
    ones marked ``\\b`` (preformatted)."""
    text = inspect.cleandoc(help_text or "").partition("\f")[0]
    return [p for p in text.split("\n\n") if p.strip() and not p.startswith("\b")]


@pytest.fixture
def render(cli, monkeypatch: pytest.MonkeyPatch):
    """``render(path)`` -> the lines of `rlpipe PATH --help` at 80 columns, colour codes removed."""
    import typer.rich_utils

    monkeypatch.setenv("COLUMNS", str(WIDTH))  # rich and click read the terminal's width here
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", WIDTH)  # ...unless $TERMINAL_WIDTH set another

    def run(path: tuple[str, ...]) -> list[str]:
        result = cli(*path, "--help")
        assert result.code == 0, result.err
        return [_ANSI.sub("", line).rstrip() for line in result.out.splitlines()]

    return run


def _segment(line: str, column: int) -> str:
    """What ``line`` holds from ``column`` on, without a panel's right border."""
    return line[column:].rstrip().removesuffix(_BORDER).rstrip()


def _flow_problem(lines: list[str], text: str) -> str | None:
    """Why ``text`` does not appear in ``lines`` flowed only by the terminal, or None when it does.

    The text starts at a word boundary of some line, in a column, and goes on in that column on
    the lines below. A line that ends before the text does must be full: the next line's first
    word (or the rest of a word broken after a hyphen) would not have fitted on it. Every column
    ends at least two cells from the right edge (padding, or a panel's border and padding), so
    ``WIDTH - 2 - column`` is a lower bound of the width text can use there.
    """
    text = " ".join(text.split())
    first = text.split()[0]
    problems = []
    for row, line in enumerate(lines):
        for match in re.finditer(rf"(?<!\S){re.escape(first)}", line):
            problem = _flow_from(lines[row:], match.start(), text)
            if problem is None:
                return None
            problems.append(problem)
    return problems[0] if problems else f"not found: {text!r}"


def _flow_from(lines: list[str], column: int, text: str) -> str | None:
    width = WIDTH - 2 - column
    shown, previous = "", ""
    for line in lines:
        words = _segment(line, column).split()
        if not words:
            return f"cut after {shown!r}"
        if shown:  # a line break: the terminal's only where the next word did not fit
            joiner = "" if shown.endswith("-") and text.startswith(shown + words[0]) else " "
            if text.startswith(shown + joiner + words[0]) and cell_len(previous) + len(joiner) + cell_len(words[0]) <= width:
                return f"a line break inside the text: {previous!r} / {words[0]!r}"
            shown += joiner
        line_text = " ".join(words)
        if (shown + line_text).startswith(text) and (shown + line_text + " ")[len(text)] == " ":
            return None  # the text ends on this line (an option's default may follow it)
        if not text.startswith(shown + line_text):
            return f"{line_text!r} where {text[len(shown) : len(shown) + len(line_text)]!r} belongs"
        shown, previous = shown + line_text, line_text
    return f"cut after {shown!r}"


def _texts(path: tuple[str, ...], command: Any) -> Iterator[tuple[str, str]]:
    """(what, text) for each text of ``command``'s own help."""
    for number, paragraph in enumerate(_paragraphs(command.help), 1):
        yield f"paragraph {number} of the description", paragraph
    for param in command.params:
        if getattr(param, "help", None):
            yield f"help of {param.name}", param.help


def _check(lines: list[str], texts: Iterator[tuple[str, str]]) -> list[str]:
    return [f"{what}: {problem}" for what, text in texts if (problem := _flow_problem(lines, text)) is not None]


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(path) or "rlpipe")
def test_help_reads_as_sentences_at_80_columns(render, path: tuple[str, ...]) -> None:
    command = COMMANDS[path]
    lines = render(path)
    wide = [line for line in lines if cell_len(line) > WIDTH]
    assert not wide, f"lines wider than {WIDTH} columns: {wide}"
    problems = _check(lines, _texts(path, command))
    shown = "\n".join(lines)
    for param in command.params:  # option names whole, not cut short
        problems += [
            f"option {opt} not shown whole"
            for opt in [*param.opts, *param.secondary_opts]
            if opt.startswith("-") and not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", shown)
        ]
    for name, sub in getattr(command, "commands", {}).items():  # a group lists its commands with their first paragraph
        problems += _check(lines, iter([(f"{name} in the command list", _paragraphs(sub.help)[0])]))
    assert not problems, f"rlpipe {' '.join(path)} --help at {WIDTH} columns:\n" + "\n".join(problems)


def test_the_check_finds_breaks_inside_sentences() -> None:
    """Controls: terminal wrapping passes; a short line before a word that would have fitted,
    a word cut with an ellipsis and a missing word fail."""
    text = "Export a run's deterministic policy (observation normalisation and action scaling included) with metadata."
    wrapped = [" Export a run's deterministic policy (observation normalisation and action", " scaling included) with metadata."]
    assert _flow_problem(wrapped, text) is None
    early = [" Export a run's deterministic policy (observation", " normalisation and action scaling included) with metadata."]
    assert "a line break inside the text" in (_flow_problem(early, text) or "")
    panel = [
        "│ export   Export a run's deterministic policy (observation normalisation     │",
        "│          and action scaling                                                 │",
        "│          included) with metadata.                                           │",
    ]
    assert "a line break inside the text" in (_flow_problem(panel, text) or "")
    cut = [f"│ {left:<58}{right:<18}│" for left, right in [("--out <path>", "Run directory"), ("", "(default:"), ("", "runs/ALGO-DATASE…")]]
    assert "belongs" in (_flow_problem(cut, "Run directory (default: runs/ALGO-DATASET).") or "")
    text = "Run directory (default: runs/ALGO-DATASET)."
    hyphen = ["Run directory", "(default:", "runs/ALGO-", "DATASET)."]  # click breaks words after a hyphen
    assert _flow_problem([f"{'':60}{line}" for line in hyphen], text) is None  # 18 columns wide
    assert "a line break" in (_flow_problem([f" {line}" for line in hyphen], text) or "")  # 77 wide
    assert "not found" in (_flow_problem(wrapped, "Import a dataset.") or "")
