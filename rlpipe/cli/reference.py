"""The CLI reference page (docs/cli.md), generated from the commands themselves.

`python -m rlpipe.cli.reference > docs/cli.md` rewrites it; a test fails when the committed
page differs from what this prints, so the reference cannot drift from the commands.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer

from rlpipe.cli.main import app


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# typer ships its own copy of click, so commands and parameters are told apart by what they have.
def _default(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False):
        return (param.opts[0] if default else param.secondary_opts[0]) if param.secondary_opts else ""
    if default is None or callable(default) or (isinstance(default, (list, tuple)) and not default):
        return ""
    return f"`{default}`"


def _rows(command: Any) -> list[str]:
    rows = []
    for param in command.params:
        if param.param_type_name == "argument":
            name = f"`{param.name.upper()}`"
        else:
            name = " / ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
        rows.append(f"| {name} | {_cell(getattr(param, 'help', None) or '')} | {_default(param)} |")
    return rows


def _section(command: Any, path: list[str]) -> list[str]:
    title = " ".join(path)
    lines = [f"## {title}", "", inspect.cleandoc(command.help or ""), ""]
    if hasattr(command, "commands"):
        lines += [f"Subcommands: {', '.join(f'`{title} {name}`' for name in sorted(command.commands))}.", ""]
        for name in sorted(command.commands):
            lines += _section(command.commands[name], [*path, name])
        return lines
    rows = _rows(command)
    if rows:
        lines += ["| argument / option | meaning | default |", "| --- | --- | --- |", *rows, ""]
    return lines


def reference() -> str:
    """The Markdown page: every command and subcommand, its help, arguments and options."""
    root: Any = typer.main.get_command(app)  # a group (typer types it as a plain command)
    lines = [
        "# CLI reference",
        "",
        "Generated from the commands (`python -m rlpipe.cli.reference > docs/cli.md`); "
        "`rlpipe COMMAND --help` prints the same. Bad input is one line on stderr and exit code 2.",
        "",
    ]
    for name in sorted(root.commands):
        lines += _section(root.commands[name], ["rlpipe", name])
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
