"""`rlpipe datasets ...`: list, show, inspect, validate, remove, import and export datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rlpipe.cli.app import app
from rlpipe.datasets.store import DatasetInfo, open_dataset, remove_dataset, store_entries, store_root
from rlpipe.errors import RlpipeError

datasets_app = typer.Typer(help="Manage the dataset store.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")

STORE_OPTION = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets).")


@datasets_app.command("list")
def list_command(store: Optional[Path] = STORE_OPTION) -> None:
    """List the datasets in the store with their env, producer, size and returns (broken ones too)."""
    from rich.console import Console  # the commands import what they use: `rlpipe collect` starts faster
    from rich.table import Column, Table

    table = Table(Column("name", no_wrap=True), Column("env", no_wrap=True), "producer", "episodes", "steps", "return mean", "formats")
    entries = store_entries(store)
    for name, info in entries:
        if not isinstance(info, DatasetInfo):
            continue
        meta = info.metadata
        mean = meta.get("episode_return", {}).get("mean")  # transition datasets have no episode statistics
        table.add_row(
            info.name,
            str(meta.get("env_id")),
            str(meta["producer"].get("algorithm")),
            str(meta["total_episodes"]),
            str(meta["total_steps"]),
            "-" if mean is None else f"{mean:.2f}",
            ",".join(meta["formats"]),
        )
    console = Console()
    console.width = max(console.width, 120)  # pipes default to 80 columns, which truncates numbers
    console.print(table if table.row_count else f"no intact datasets in {store_root(store)}")
    for name, error in entries:
        if not isinstance(error, DatasetInfo):
            typer.echo(f"{name}: broken: {error}")


@datasets_app.command("show")
def show_command(name: str = typer.Argument(..., help="Dataset name."), store: Optional[Path] = STORE_OPTION) -> None:
    """Print a dataset's metadata.json."""
    typer.echo(json.dumps(open_dataset(name, store).metadata, indent=2, sort_keys=True))


@datasets_app.command("inspect")
def inspect_command(name: str = typer.Argument(..., help="Dataset name."), store: Optional[Path] = STORE_OPTION) -> None:
    """Summarise a dataset with polars: episodes, steps, return distribution, action statistics
    (after the checks loading runs)."""
    import polars as pl

    from rlpipe.datasets.summary import summary_tables

    info = open_dataset(name, store)
    typer.echo(f"{info.name}: env {info.env_id}, observations {info.observation_space}, actions {info.action_space}")
    with pl.Config(tbl_rows=20, tbl_cols=12, fmt_str_lengths=40):
        for title, frame in summary_tables(info).items():
            typer.echo(f"\n{title}")
            typer.echo(str(frame))


@datasets_app.command("validate")
def validate_command(name: str = typer.Argument(..., help="Dataset name."), store: Optional[Path] = STORE_OPTION) -> None:
    """Re-check a dataset: files, sizes and content hash, every check loading runs (schema,
    nulls, counts, NaN/inf, actions in the space, chained rows) and its HDF5 copy."""
    from rlpipe.datasets.validate import validate_dataset

    info = open_dataset(name, store, check_files=False)
    problems = validate_dataset(info)
    if problems:
        raise RlpipeError(f"dataset {name!r} is corrupted: " + "; ".join(problems))
    typer.echo(f"{name}: ok ({info.metadata['total_steps']} steps, content hash {info.metadata['content_hash'][:16]})")


@datasets_app.command("rm")
def rm_command(name: str = typer.Argument(..., help="Dataset name."), store: Optional[Path] = STORE_OPTION) -> None:
    """Delete a dataset from the store."""
    typer.echo(f"removed {remove_dataset(name, store)}")


@datasets_app.command("import")
def import_command(
    minari_id: str = typer.Argument(..., help="Id of a local Minari dataset, ns/name-vN (either backend; Tuple and Text spaces are refused)."),
    name: Optional[str] = typer.Option(None, "--name", help="Dataset name (default: the Minari id with '/' as '-')."),
    fmt: str = typer.Option("both", "--format", help="arrow, hdf5 or both."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset of the same name."),
    store: Optional[Path] = STORE_OPTION,
) -> None:
    """Convert a local Minari dataset into an rlpipe dataset."""
    from rlpipe.datasets.minari_io import import_from_minari

    path = import_from_minari(minari_id, name or minari_id.replace("/", "-"), store=store, fmt=fmt, force=force)
    typer.echo(f"imported {minari_id} -> {path}")


@datasets_app.command("export")
def export_command(
    name: str = typer.Argument(..., help="Dataset name."),
    to: str = typer.Option("minari", "--to", help="Target: minari."),
    dataset_id: Optional[str] = typer.Option(None, "--id", help="Minari dataset id, (namespace/)name-vN (default: rlpipe/NAME-v0)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing Minari dataset with that id."),
    store: Optional[Path] = STORE_OPTION,
) -> None:
    """Export a dataset to Minari's dataset root ($MINARI_DATASETS_PATH or Minari's default)."""
    from rlpipe.datasets.hdf5 import default_minari_id
    from rlpipe.datasets.minari_io import export_to_minari

    if to != "minari":
        raise RlpipeError(f"unknown export target {to!r}: use --to minari")
    info = open_dataset(name, store)
    path = export_to_minari(info, dataset_id, force=force)
    typer.echo(f"exported {name} -> {path} (minari.load_dataset({(dataset_id or default_minari_id(info.name))!r}))")
