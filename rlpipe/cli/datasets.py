"""`rlpipe datasets ...`: list, show, inspect, validate, remove, import and export datasets."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlpipe.cli.app import TRUST_ENV_SPEC_OPTION, app, seed_option
from rlpipe.datasets.store import DatasetInfo, open_dataset, remove_dataset, store_entries, store_root
from rlpipe.errors import RlpipeError

datasets_app = typer.Typer(help="Manage the dataset store.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")

STORE_OPTION = typer.Option(None, "--store", help="Dataset store (default: $RLPIPE_DATASETS or ./datasets).")


@datasets_app.command("list")
def list_command(store: Path | None = STORE_OPTION) -> None:
    """List the datasets in the store, broken ones too.

    Each with its env, producer, size and returns.
    """
    from rich.console import Console  # the commands import what they use: `rlpipe collect` starts faster
    from rich.table import Column, Table

    table = Table(Column("name", no_wrap=True), Column("env", no_wrap=True), "producer", "episodes", "steps", "return mean", "formats")
    entries = store_entries(store)
    for _, info in entries:
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
def show_command(name: str = typer.Argument(..., help="Dataset name."), store: Path | None = STORE_OPTION) -> None:
    """Print a dataset's metadata.json."""
    typer.echo(json.dumps(open_dataset(name, store).metadata, indent=2, sort_keys=True))


@datasets_app.command("inspect")
def inspect_command(name: str = typer.Argument(..., help="Dataset name."), store: Path | None = STORE_OPTION) -> None:
    """Summarise a dataset with polars.

    Episodes, steps, the return distribution and action statistics, after the checks that loading runs.
    """
    import polars as pl

    from rlpipe.datasets.summary import summary_tables

    info = open_dataset(name, store)
    typer.echo(f"{info.name}: env {info.env_id}, observations {info.observation_space}, actions {info.action_space}")
    with pl.Config(tbl_rows=20, tbl_cols=12, fmt_str_lengths=40):
        for title, frame in summary_tables(info).items():
            typer.echo(f"\n{title}")
            typer.echo(str(frame))


@datasets_app.command("validate")
def validate_command(
    name: str = typer.Argument(..., help="Dataset name."),
    store: Path | None = STORE_OPTION,
    trust_env_spec: bool = TRUST_ENV_SPEC_OPTION,
) -> None:
    """Re-check a dataset: its files, its contents and its env spec.

    It checks files, sizes, the content hash and all that loading checks (schema, nulls, counts, NaN/inf, actions in the space, chained rows).

    It also checks the HDF5 copy, and that the env spec names only code registered here (or is trusted).
    """
    from rlpipe.datasets.validate import require_trusted_env, validate_dataset

    info = open_dataset(name, store, check_files=False)
    problems = validate_dataset(info)
    if problems:
        raise RlpipeError(f"dataset {name!r} is corrupted: " + "; ".join(problems))
    require_trusted_env(info)
    typer.echo(f"{name}: ok ({info.metadata['total_steps']} steps, content hash {info.metadata['content_hash'][:16]})")


@datasets_app.command("rm")
def rm_command(name: str = typer.Argument(..., help="Dataset name."), store: Path | None = STORE_OPTION) -> None:
    """Delete a dataset from the store."""
    typer.echo(f"removed {remove_dataset(name, store)}")


def _column_names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(part.strip() for part in text.split(","))


@datasets_app.command("import")
def import_command(
    source: str = typer.Argument(
        ...,
        help="A local Minari dataset's id, ns/name-vN (--from minari; either backend), the file to import, or a LeRobot dataset's directory.",
    ),
    source_format: str = typer.Option(
        "minari",
        "--from",
        help="Source format: minari, parquet, csv, arrow (IPC), npz (D4RL's names), d4rl (HDF5), ogbench (.npz) or lerobot (a LeRobotDataset v3 directory).",
    ),
    name: str | None = typer.Option(None, "--name", help="Dataset name (default: the Minari id with '/' as '-', or the file's stem)."),
    env: str | None = typer.Option(None, "--env", help="Env id of the data: its spaces, evaluation in training (default: none)."),
    fmt: str = typer.Option("both", "--format", help="arrow, hdf5 or both."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset of the same name."),
    store: Path | None = STORE_OPTION,
    obs_columns: str | None = typer.Option(
        None, "--obs-columns", "--obs-column", help="Observation columns, a,b,c (scalars, concatenated) or one list column."
    ),
    next_obs_columns: str | None = typer.Option(
        None, "--next-obs-columns", "--next-obs-column", help="Next-observation columns (default: the next row's observation)."
    ),
    action_column: str | None = typer.Option(None, "--action-column", help="Action column (or scalar columns a,b)."),
    reward_column: str | None = typer.Option(None, "--reward-column", help="Reward column."),
    terminated_column: str | None = typer.Option(None, "--terminated-column", help="Termination flags (0/1 or booleans)."),
    truncated_column: str | None = typer.Option(None, "--truncated-column", help="Truncation (time-out) flags."),
    episode_column: str | None = typer.Option(
        None, "--episode-column", help="Episode ids (default: episode_id or episode; without one, episodes end at flags)."
    ),
    step_column: str | None = typer.Option(None, "--step-column", help="Step within the episode, checked to count up by 1."),
    ignore_columns: str | None = typer.Option(None, "--ignore-columns", help="Table columns to leave out, a,b."),
    action_space: str | None = typer.Option(
        None, "--action-space", help="box:LOW,HIGH or discrete:N (default: the env's, else inferred from the data)."
    ),
) -> None:
    """Import a Minari dataset, a data file or a LeRobot dataset.

    Files are tables of transitions (parquet, csv, arrow) or arrays (npz, d4rl, ogbench). Columns have default names (obs, action, reward, terminated, truncated, episode_id, step, or D4RL's); without next observations an episode's terminated last row keeps its own and a truncated one is dropped. An inconsistent row is one line and nothing is written.

    lerobot reads a LeRobotDataset v3 directory's data files in order: observation.state (or observation.image, PNG frames as uint8 images), action, next.reward (0 when absent, recorded in the metadata), next.done (terminated), next.truncated, episode_index and frame_index (as step). A video feature a role maps (--obs-column observation.images.top) is decoded with PyAV (pip install 'rlpipe[lerobot]') into uint8 frames, each the one at its episode's from_timestamp plus its timestamp, within 1e-4 s; video codecs are lossy (docs/datasets.md states the PSNR). Video features left out with --ignore-columns are not decoded.
    """
    if source_format == "minari":
        from rlpipe.datasets.minari_io import import_from_minari

        given = (env, obs_columns, next_obs_columns, action_column, reward_column, terminated_column, truncated_column)
        if any(option is not None for option in (*given, episode_column, step_column, ignore_columns, action_space)):
            raise RlpipeError("--env, --action-space and the column options are for files; a Minari dataset keeps its own")
        path = import_from_minari(source, source.replace("/", "-") if name is None else name, store=store, fmt=fmt, force=force)
    else:
        from rlpipe.datasets.imports import import_file

        roles = {
            "obs": obs_columns,
            "next_obs": next_obs_columns,
            "action": action_column,
            "reward": reward_column,
            "terminated": terminated_column,
            "truncated": truncated_column,
            "episode": episode_column,
            "step": step_column,
        }
        path = import_file(
            source,
            Path(source).stem if name is None else name,
            source_format=source_format,
            columns={role: names for role, text in roles.items() if (names := _column_names(text))},
            ignore_columns=_column_names(ignore_columns) or (),
            action_space=action_space,
            env_id=env,
            store=store,
            fmt=fmt,
            force=force,
        )
    typer.echo(f"imported {source} -> {path}")


@datasets_app.command("export")
def export_command(
    name: str = typer.Argument(..., help="Dataset name."),
    to: str = typer.Option(
        "minari",
        "--to",
        help="Target: minari (Minari's dataset root), parquet, d4rl (D4RL's HDF5 layout), npz (D4RL's arrays), ogbench (OGBench's .npz layout) or lerobot (a LeRobotDataset v3 directory).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="The file to write (parquet, d4rl, npz and ogbench), or the directory (lerobot); not minari."
    ),
    dataset_id: str | None = typer.Option(None, "--id", help="Minari dataset id, (namespace/)name-vN (default: rlpipe/NAME-v0)."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing Minari dataset with that id, an existing --out file, or a LeRobot dataset at --out."
    ),
    store: Path | None = STORE_OPTION,
) -> None:
    """Export a dataset in another tool's format (Minari, D4RL, ...).

    minari: Minari's layout in $MINARI_DATASETS_PATH (or Minari's default). parquet: one row per transition (episode_id, step, obs, action, reward, next_obs, terminated, truncated; Box values, images too, as lists of their flattened values, the shape in the field's metadata; metadata.json as the file's key-value metadata), loadable with Hugging Face datasets. d4rl and npz: observations, actions, rewards, next_observations, terminals, timeouts (floats as float32, as in D4RL); they have no episode ids, steps or spaces (an import recovers episodes from terminals and timeouts, infers the spaces unless given --env), and a step both terminated and truncated is a terminal only. ogbench: OGBench's layout, which ogbench.load_dataset reads: per episode its observations then its final next observation as a row of its own (terminals 1.0 there, its action the episode's last), floats as float32, Box observations only; also rewards and terminations (0 on the final-state rows) for rlpipe's import, which OGBench's loader does not read (it keeps observations, actions, next_observations and terminals, 1 on each trajectory's last transition). lerobot: a LeRobotDataset v3 directory (meta/info.json, stats.json, tasks.parquet, episodes; data/chunk-000/file-000.parquet, ...), one frame per transition: observation.state (or observation.image for uint8 RGB frames, as PNG), action, next.reward, next.done (terminated), next.truncated; no next observations (an import takes the next frame's). No format carries the info columns. The file or directory is written beside --out and renamed once complete.
    """
    from rlpipe.datasets.exports import EXPORT_FORMATS, FILE_FORMATS, export_file

    if to not in EXPORT_FORMATS:
        raise RlpipeError(f"unknown export target {to!r}: choose one of {', '.join(EXPORT_FORMATS)}")
    if to != "minari":
        if out is None:
            raise RlpipeError(f"--to {to} writes {'a directory: give --out DIR' if to == 'lerobot' else 'a file: give --out FILE'}")
        if dataset_id is not None:
            raise RlpipeError("--id names a Minari dataset: it is for --to minari")
        rows = export_file(open_dataset(name, store), out, to, force=force)
        typer.echo(f"exported {name} -> {out} ({rows} transitions, {to})")
        return
    from rlpipe.datasets.hdf5 import default_minari_id
    from rlpipe.datasets.minari_io import export_to_minari

    if out is not None:
        raise RlpipeError(f"--out is for the file targets ({', '.join(FILE_FORMATS)}): --to minari writes to Minari's dataset root (--id)")
    info = open_dataset(name, store)
    path = export_to_minari(info, dataset_id, force=force)
    typer.echo(f"exported {name} -> {path} (minari.load_dataset({(dataset_id or default_minari_id(info.name))!r}))")


FORMAT_OPTION = typer.Option("arrow", "--format", help="arrow, hdf5 or both (hdf5: Minari's layout beside the Arrow shards).")
FORCE_OPTION = typer.Option(False, "--force", help="Replace an existing dataset of the same name.")
SEED_OPTION = seed_option(0, "Seed of the random choice of episodes.")


def _print_written(path: Path) -> None:
    from rlpipe.datasets.store import read_metadata

    meta = read_metadata(path)
    typer.echo(f"wrote {path} ({meta['total_episodes']} episodes, {meta['total_steps']} steps)")


def _weights(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise RlpipeError(f"--weights takes comma-separated numbers such as 0.5,0.5, got {text!r}") from None


@datasets_app.command("merge")
def merge_command(
    sources: list[str] = typer.Argument(..., help="Two or more datasets of the same env and spaces."),
    name: str = typer.Option(..., "--name", help="Name of the merged dataset."),
    weights: str | None = typer.Option(
        None, "--weights", help="Step shares per source, e.g. 0.5,0.5 (default: every episode of every source)."
    ),
    seed: int = SEED_OPTION,
    fmt: str = FORMAT_OPTION,
    force: bool = FORCE_OPTION,
    store: Path | None = STORE_OPTION,
) -> None:
    """Merge datasets into a new one, recording its lineage.

    The new dataset holds the sources' whole episodes, in source order.
    """
    from rlpipe.datasets.ops import merge_datasets

    _print_written(
        merge_datasets(sources, name, weights=None if weights is None else _weights(weights), seed=seed, store=store, fmt=fmt, force=force)
    )


def _episode_ids(text: str) -> list[int]:
    """`--episodes 3,5,8` or `--episodes @ids.txt` (whitespace- or comma-separated ids): ids
    that fit the int64 episode_id column; an @FILE is a regular file of at most
    MAX_ARGUMENT_FILE_BYTES, read no further (never a device or a FIFO)."""
    from rlpipe.limits import MAX_ARGUMENT_FILE_BYTES
    from rlpipe.storage.files import read_limited

    if text.startswith("@"):
        source = text[1:]
        try:
            raw = read_limited(source, MAX_ARGUMENT_FILE_BYTES, follow_links=True)
        except OSError as exc:
            raise RlpipeError(f"--episodes: cannot read episode ids from {source}: {exc.strerror or exc}") from None
        except ValueError:  # a NUL in the name
            raise RlpipeError(f"--episodes: cannot read episode ids from {source!r}: not a file name") from None
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise RlpipeError(f"--episodes: {source} is not a text file of episode ids") from None
    try:
        ids = [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise RlpipeError("--episodes takes episode ids such as 3,5,8 or @FILE with one id per line") from None
    if not ids:
        raise RlpipeError("--episodes names no episode")
    outside = next((i for i in ids if not -(2**63) <= i < 2**63), None)
    if outside is not None:
        digits = str(outside)
        shown = digits if len(digits) <= 30 else f"{digits[:12]}...{digits[-6:]} ({len(digits)} digits)"
        raise RlpipeError(f"--episodes: episode id {shown} is out of range (ids are 64-bit integers, below 2**63)")
    return ids


@datasets_app.command("filter")
def filter_command(
    source: str = typer.Argument(..., help="Dataset to filter."),
    name: str = typer.Option(..., "--name", help="Name of the filtered dataset."),
    top_return: str | None = typer.Option(
        None, "--top-return", help="Keep the best episodes by return: a percentage (10%) or a count (50)."
    ),
    min_return: float | None = typer.Option(None, "--min-return", help="Keep episodes whose return is at least this."),
    max_length: int | None = typer.Option(None, "--max-length", help="Keep episodes of at most this many steps."),
    episodes: str | None = typer.Option(None, "--episodes", help="Keep these episode ids: 3,5,8 or @FILE."),
    fmt: str = FORMAT_OPTION,
    force: bool = FORCE_OPTION,
    store: Path | None = STORE_OPTION,
) -> None:
    """Keep the episodes that pass every given criterion.

    For example %BC's data, the top 10% of the episodes by return: --top-return 10%.
    """
    from rlpipe.datasets.ops import filter_dataset

    _print_written(
        filter_dataset(
            source,
            name,
            top_return=top_return,
            min_return=min_return,
            max_length=max_length,
            episode_ids=None if episodes is None else _episode_ids(episodes),
            store=store,
            fmt=fmt,
            force=force,
        )
    )


@datasets_app.command("split")
def split_command(
    source: str = typer.Argument(..., help="Dataset to split."),
    val: float = typer.Option(..., "--val", help="Fraction of the episodes for the validation side, e.g. 0.1."),
    train_name: str | None = typer.Option(None, "--train-name", help="Training side's name (default: SOURCE-train)."),
    val_name: str | None = typer.Option(None, "--val-name", help="Validation side's name (default: SOURCE-val)."),
    seed: int = SEED_OPTION,
    fmt: str = FORMAT_OPTION,
    force: bool = FORCE_OPTION,
    store: Path | None = STORE_OPTION,
) -> None:
    """Split a dataset's episodes into training and validation sets.

    Each side is a new dataset; --seed decides which episodes go where.
    """
    from rlpipe.datasets.ops import split_dataset

    for path in split_dataset(
        source,
        val,
        train_name=f"{source}-train" if train_name is None else train_name,
        val_name=f"{source}-val" if val_name is None else val_name,
        seed=seed,
        store=store,
        fmt=fmt,
        force=force,
    ):
        _print_written(path)


@datasets_app.command("sample")
def sample_command(
    source: str = typer.Argument(..., help="Dataset to sample from."),
    name: str = typer.Option(..., "--name", help="Name of the sampled dataset."),
    episodes: int | None = typer.Option(None, "--episodes", help="Number of whole episodes to keep."),
    steps: int | None = typer.Option(None, "--steps", help="Keep the fewest random episodes holding at least this many steps."),
    seed: int = SEED_OPTION,
    fmt: str = FORMAT_OPTION,
    force: bool = FORCE_OPTION,
    store: Path | None = STORE_OPTION,
) -> None:
    """Take a seeded random subset of whole episodes.

    A smaller dataset of the same data, to study how results scale with data.
    """
    from rlpipe.datasets.ops import sample_dataset

    _print_written(sample_dataset(source, name, episodes=episodes, steps=steps, seed=seed, store=store, fmt=fmt, force=force))


@datasets_app.command("lineage")
def lineage_command(name: str = typer.Argument(..., help="Dataset name."), store: Path | None = STORE_OPTION) -> None:
    """Print how a dataset was derived.

    Back to the collections, through merge, filter, split, sample and HER relabelling.
    """
    from rlpipe.datasets.summary import lineage_tree

    for line in lineage_tree(open_dataset(name, store, check_files=False), store):
        typer.echo(line)
