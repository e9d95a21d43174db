"""The typer app that every command module adds its commands to (kept apart from
`rlpipe.cli.main`, which imports the command modules, so there is no import loop)."""

from __future__ import annotations

from typing import Any

import typer

from rlpipe.limits import MAX_SEED

app = typer.Typer(
    name="rlpipe",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's help layout: it flows every text to the terminal's width. typer's rich panels, at
    # 80 columns, squeeze the options into a narrow column and cut long option names and words
    # with an ellipsis (`rlpipe train --help`); tests/test_cli_help.py checks the layout.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from rlpipe.version import __version__

        typer.echo(f"rlpipe {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print rlpipe's version and exit."),
) -> None:
    """Offline-RL and imitation-learning data pipeline: collect, store, train, evaluate."""


def _trust_env_specs(trust: bool) -> bool:
    if trust:  # through the environment, so sweep and collection workers trust them too
        from rlpipe.envs import trust_env_specs

        trust_env_specs()
    return trust


# Every command that builds an env from a dataset's or a run's record takes this flag; it acts
# when parsed (its callback), so the commands' bodies do not read it.
TRUST_ENV_SPEC_OPTION = typer.Option(
    False,
    "--trust-env-spec",
    callback=_trust_env_specs,
    help="Build envs from the env specs of datasets and runs even when they name code that is not registered here "
    "(importing it runs it: only for data you trust). Same as RLPIPE_TRUST_ENV_SPEC=1.",
)


def seed_option(default: int | None, help: str) -> Any:
    """The `--seed` option of every command: the same range everywhere (rlpipe.limits),
    which the help shows as [0<=x<=4294967295]."""
    return typer.Option(default, "--seed", min=0, max=MAX_SEED, help=help)
