"""The typer app that every command module adds its commands to (kept apart from
`rlpipe.cli.main`, which imports the command modules, so there is no import loop)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="rlpipe",
    help="Offline-RL and imitation-learning data pipeline: collect, store, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
