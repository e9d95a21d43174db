"""`rlpipe relabel her`: hindsight goal relabelling of a goal-conditioned dataset."""

from __future__ import annotations

from pathlib import Path

import typer

from rlpipe.cli.app import TRUST_ENV_SPEC_OPTION, app, seed_option
from rlpipe.datasets.her import STRATEGIES, relabel_dataset
from rlpipe.datasets.store import open_dataset

relabel_app = typer.Typer(help="Dataset transforms that rewrite goals.", no_args_is_help=True)
app.add_typer(relabel_app, name="relabel")


@relabel_app.command("her")
def her_command(
    dataset: str = typer.Option(..., "--dataset", help="Goal-conditioned source dataset (Dict observations)."),
    strategy: str = typer.Option("future", "--strategy", help=f"Goal choice: {', '.join(STRATEGIES)}."),
    k: int = typer.Option(4, "--k", help="Relabelled copies per transition (final makes one); at most 2**32 relabelled rows in all."),
    name: str | None = typer.Option(None, "--name", help="Output dataset (default: <dataset>-her-<strategy>)."),
    seed: int = seed_option(0, "Seed of the goal sampling."),
    store: Path | None = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output dataset."),
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Add k HER-relabelled copies of each transition, as a new dataset.

    The new dataset holds the source transitions and their copies.
    """
    info = open_dataset(dataset, store)
    path = relabel_dataset(
        info, f"{dataset}-her-{strategy}" if name is None else name, strategy=strategy, k=k, seed=seed, store=store, force=force
    )
    meta = open_dataset(path.name, store).metadata
    typer.echo(f"wrote {path}: {meta['total_steps']} transitions ({info.metadata['total_steps']} original), strategy {strategy}")
