"""The typer app that every command module adds its commands to (kept apart from
`rlpipe.cli.main`, which imports the command modules, so there is no import loop)."""

from __future__ import annotations

from typing import Any

import typer

from rlpipe.limits import MAX_SEED

app = typer.Typer(
    name="rlpipe",
    help="Offline-RL and imitation-learning data pipeline: collect, store, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def seed_option(default: int | None, help: str) -> Any:
    """The `--seed` option of every command: the same range everywhere (rlpipe.limits),
    which the help shows as [0<=x<=4294967295]."""
    return typer.Option(default, "--seed", min=0, max=MAX_SEED, help=help)
