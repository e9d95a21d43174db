"""Moving datasets between rlpipe and Minari.

Export hard-links our Minari-layout HDF5 (`data/`) into Minari's dataset root, so any
Minari tool can read it. Import reads any local Minari dataset (HDF5 or Arrow backend)
through Minari's own API and writes it in our format, a batch of episodes at a time.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlpipe.datasets.hdf5 import check_minari_id, default_minari_id
from rlpipe.datasets.schema import Columnar, concat_columnar, map_columnar
from rlpipe.datasets.store import MINARI_DIR, DatasetInfo
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError


def minari_root() -> Path:
    """Minari's dataset root: $MINARI_DATASETS_PATH, else Minari's default (~/.minari/datasets)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path())


def export_to_minari(info: DatasetInfo, dataset_id: str | None = None, force: bool = False) -> Path:
    """Make dataset `info` loadable as `minari.load_dataset(dataset_id)`; returns its Minari directory."""
    if info.hdf5_path is None:
        raise RlpipeError(f"dataset {info.name!r} has no HDF5 copy (it was written with --format arrow)")
    dataset_id = check_minari_id(dataset_id or default_minari_id(info.name))
    target = minari_root() / dataset_id
    if target.exists():
        if not force:
            raise RlpipeError(f"Minari dataset {dataset_id!r} already exists at {target} (use --force to replace it)")
        shutil.rmtree(target)
    staging = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / MINARI_DIR).mkdir(parents=True)
    for source in sorted((info.path / MINARI_DIR).iterdir()):
        destination = staging / MINARI_DIR / source.name
        try:
            os.link(source, destination)  # same bytes, no copy; Minari only reads
        except OSError:
            shutil.copy2(source, destination)
    _set_minari_id(staging / MINARI_DIR / "metadata.json", dataset_id)
    staging.rename(target)
    return target


def _set_minari_id(metadata_path: Path, dataset_id: str) -> None:
    metadata = json.loads(metadata_path.read_text())
    metadata["dataset_id"] = dataset_id
    metadata_path.unlink()  # break the hard link before rewriting
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

    try:
        source = minari.load_dataset(check_minari_id(dataset_id))
    except (FileNotFoundError, ValueError) as exc:
        raise RlpipeError(f"cannot open Minari dataset {dataset_id!r}: {exc}") from None
    env_spec = source.env_spec
    source_metadata = source.storage.metadata
    producer = {
        "algorithm": source_metadata.get("algorithm_name") or "unknown",
        "imported_from": f"minari:{dataset_id}",
        "minari_version": source.minari_version,
        "checkpoint_sha256": None,
    }
    return write_rows(
        name,
        _episode_rows(source, batch_episodes=1000),
        source.observation_space,
        source.action_space,
        env_id=env_spec.id if env_spec is not None else None,
        env_spec=env_spec.to_json() if env_spec is not None else None,  # the source's time limit and kwargs, not ours
        producer=producer,
        store=store,
        fmt=fmt,
        force=force,
    )
