"""The `rlpipe` console script: run the typer app with its commands registered."""

from __future__ import annotations

import errno
import signal
import sys

import typer

from rlpipe.cli import collect, datasets, export, ope, relabel, report, scoreboard, sweep, train  # noqa: F401  (each adds its commands to `app`)
from rlpipe.cli.app import app
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import handle_termination, interrupt_signal


def main() -> None:
    """Entry point: run the app; RlpipeError and usage errors become one line and exit 2."""
    handle_termination()  # SIGTERM (timeout, CI) cleans up like Ctrl-C
    empty = _empty_argument(sys.argv[1:])
    if empty is not None:
        typer.echo(f"error: {empty}", err=True)  # as a path, "" would silently mean the current directory
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except RlpipeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors: typer vendors click's exceptions
        typer.echo(f"error: {exc.format_message()} (see rlpipe --help)", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # a path given to read (a run, a store) with a name longer than the file system allows, wherever first looked up
        if exc.errno != errno.ENAMETOOLONG:
            raise
        typer.echo(f"error: {exc.filename}: {exc.strerror}", err=True)
        sys.exit(2)
    except (MemoryError, RuntimeError) as exc:  # a size setting beyond this machine (the counts users give most are bounded up front)
        if not _out_of_memory(exc):
            raise
        first = (str(exc).strip().splitlines() or ["an allocation failed"])[0]  # torch's allocator appends its C++ frames
        typer.echo(f"error: out of memory: {first}; lower the sizes given", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    # typer turns KeyboardInterrupt into a silent return of 130; a signal that C code
    # swallowed is remembered by handle_termination: either way, say so and exit 128 + signal.
    if code == 130 or interrupt_signal() is not None:
        typer.echo("error: interrupted", err=True)
        sys.exit(128 + (interrupt_signal() or signal.SIGINT))
    sys.exit(code if isinstance(code, int) else 0)


def _empty_argument(args: list[str]) -> str | None:
    """What is empty: an option's value (``--out ''``, ``--out=``) or a positional argument;
    None when every argument holds something."""
    for before, arg in zip(["", *args], args):
        if arg == "":
            return f"{before} is given an empty value" if before.startswith("-") else f"the argument after {before or 'rlpipe'!r} is empty"
        if arg.startswith("--") and arg.endswith("="):
            return f"{arg[:-1]} is given an empty value"
    return None


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: numpy's MemoryError, or torch's (without importing torch): the
    CPU allocator's RuntimeError and CUDA's OutOfMemoryError."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(exc)


if __name__ == "__main__":
    main()
