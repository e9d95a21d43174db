"""The `rlpipe` console script: run the typer app with its commands registered."""

from __future__ import annotations

import sys

import typer

from rlpipe.cli import collect, datasets, relabel, report, sweep, train  # noqa: F401  (each adds its commands to `app`)
from rlpipe.cli.app import app
from rlpipe.errors import RlpipeError


def main() -> None:
    """Entry point: run the app; RlpipeError and usage errors become one line and exit 2."""
    try:
        code = app(standalone_mode=False)
    except RlpipeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors: typer vendors click's exceptions
        typer.echo(f"error: {exc.format_message()} (see rlpipe --help)", err=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
