"""Moving datasets between rlpipe and Minari.

Export validates the dataset, then copies our Minari-layout HDF5 (`data/`) into Minari's
dataset root (a copy: a tool writing to the export must not change the store), published
like a dataset (`rlpipe.datasets.atomic`), so any Minari tool can read it. Import reads any local Minari dataset (HDF5 or Arrow backend)
through Minari's own API and writes it in our format, a batch of episodes at a time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlpipe.datasets.atomic import StagedDirectory
from rlpipe.datasets.schema import Columnar, concat_columnar, map_columnar
from rlpipe.datasets.store import MINARI_DIR, MINARI_METADATA_FILE, DatasetInfo
from rlpipe.datasets.validate import require_valid
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError


def minari_root() -> Path:
    """Minari's dataset root: $MINARI_DATASETS_PATH, else Minari's default (~/.minari/datasets)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path())


def check_minari_id(dataset_id: str) -> str:
    """Return `dataset_id` if it is a Minari id (`[namespace/]name-vN`) that stays inside
    Minari's root, else raise."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except ValueError as exc:
        raise RlpipeError(str(exc)) from None
    if any(part in ("", ".", "..") for part in dataset_id.split("/")):
        raise RlpipeError(f"Minari dataset id {dataset_id!r} must stay inside Minari's dataset root")
    return dataset_id


def _is_minari_dataset(path: Path) -> bool:
    return (path / MINARI_METADATA_FILE).is_file()


def export_to_minari(info: DatasetInfo, dataset_id: str | None = None, force: bool = False) -> Path:
    """Make dataset `info` loadable as `minari.load_dataset(dataset_id)`; returns its Minari directory.

    The dataset is validated first; `force` replaces only a Minari dataset at exactly that
    id (never a namespace or another directory), and the old one survives a crash."""
    if info.hdf5_path is None:
        raise RlpipeError(f"dataset {info.name!r} has no HDF5 copy (it was written with --format arrow)")
    dataset_id = check_minari_id(dataset_id or info.name)
    require_valid(info)
    target = minari_root() / dataset_id

    def check_target(path: Path) -> None:
        if path.is_symlink() or (path.exists() and not _is_minari_dataset(path)):
            raise RlpipeError(f"{path} exists and is not a Minari dataset (a namespace or another directory); refusing to replace it")
        if path.exists() and not force:
            raise RlpipeError(f"Minari dataset {dataset_id!r} already exists at {target} (use --force to replace it)")

    staging = StagedDirectory(target, f"Minari dataset {dataset_id!r}", _is_minari_dataset, check_target)
    try:
        (staging.path / MINARI_DIR).mkdir()
        for source in sorted((info.path / MINARI_DIR).iterdir()):
            shutil.copyfile(source, staging.path / MINARI_DIR / source.name)
        _set_minari_id(staging.path / MINARI_DIR / "metadata.json", dataset_id)
        return staging.commit()
    finally:
        staging.abort()


def _set_minari_id(metadata_path: Path, dataset_id: str) -> None:
    metadata = json.loads(metadata_path.read_text())
    metadata["dataset_id"] = dataset_id
    metadata_path.write_text(json.dumps(metadata, sort_keys=True))


def _episode_rows(minari_dataset: Any, batch_episodes: int) -> Iterator[dict[str, Columnar]]:
    parts: list[dict[str, Columnar]] = []
    for index, episode in enumerate(minari_dataset.iterate_episodes()):
        length = len(episode.rewards)
        if length == 0:
            continue
        observations = episode.observations
        parts.append(
            {
                "episode_id": np.full(length, index, dtype=np.int64),
                "step": np.arange(length, dtype=np.int32),
                "obs": map_columnar(observations, lambda a: np.asarray(a)[:-1]),
                "action": np.asarray(episode.actions),
                "reward": np.asarray(episode.rewards, dtype=np.float32),
                "next_obs": map_columnar(observations, lambda a: np.asarray(a)[1:]),
                "terminated": np.asarray(episode.terminations, dtype=bool),
                "truncated": np.asarray(episode.truncations, dtype=bool),
            }
        )
        if len(parts) == batch_episodes:
            yield {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}
            parts = []
    if parts:
        yield {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}


def import_from_minari(dataset_id: str, name: str, *, store: Any = None, fmt: str = "both", force: bool = False) -> Path:
    """Convert the local Minari dataset `dataset_id` into rlpipe dataset `name`."""
    import minari

    check_minari_id(dataset_id)
    try:
        source = minari.load_dataset(dataset_id)
    except (FileNotFoundError, ValueError) as exc:
        raise RlpipeError(f"cannot open Minari dataset {dataset_id!r}: {exc}") from None
    env_spec = source.spec.env_spec
    source_metadata = source.storage.metadata
    producer = {
        "algorithm": source_metadata.get("algorithm_name") or "unknown",
        "imported_from": f"minari:{dataset_id}",
        "minari_version": source.spec.minari_version,
        "checkpoint_sha256": None,
    }
    return write_rows(
        name,
        _episode_rows(source, batch_episodes=1000),
        source.observation_space,
        source.action_space,
        env_id=env_spec.id if env_spec is not None else None,
        producer=producer,
        store=store,
        fmt=fmt,
        force=force,
    )
