"""Moving datasets between rlpipe and Minari.

Export validates the dataset, then copies our Minari-layout HDF5 (`data/`) into Minari's
dataset root (a copy: a tool writing to the export must not change the store), or, for an
Arrow-only dataset, writes that layout there from the shards, streamed; either is published
like a dataset (`rlpipe.storage.atomic`), so any Minari tool can read it. Import reads a
local Minari dataset (HDF5 or Arrow backend; spaces other than Box, Discrete, MultiDiscrete,
MultiBinary and Dict, such as Tuple and Text, are refused) through Minari's own API and
writes it in our format, a batch of episodes at a time, keeping its env spec, optional
metadata, episode seeds and infos.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlpipe.datasets.hdf5 import MINARI_METADATA_KEYS, check_minari_id, default_minari_id, minari_metadata, write_minari_layout
from rlpipe.datasets.loader import info_space_of
from rlpipe.datasets.schema import Columnar, concat_columnar, info_value_space, map_columnar
from rlpipe.datasets.store import MINARI_DIR, MINARI_HDF5_FILE, MINARI_METADATA_FILE, DatasetInfo, check_name
from rlpipe.datasets.validate import require_valid
from rlpipe.datasets.writer import write_rows
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import StagedDirectory
from rlpipe.storage.files import check_output_dir, loads_json


def minari_root() -> Path:
    """Minari's dataset root: $MINARI_DATASETS_PATH, else Minari's default (~/.minari/datasets)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path())


def _is_minari_dataset(path: Path) -> bool:
    return (path / MINARI_METADATA_FILE).is_file()


def export_to_minari(info: DatasetInfo, dataset_id: str | None = None, force: bool = False) -> Path:
    """Make dataset `info` loadable as `minari.load_dataset(dataset_id)`; returns its Minari directory.

    The dataset is validated first; `force` replaces only a Minari dataset at exactly that
    id (never a namespace or another directory), and the old one survives a crash."""
    if info.metadata["multi_agent"] or info.metadata.get("kind") == "transitions":
        raise RlpipeError(
            f"dataset {info.name!r} holds {'multi-agent rows' if info.metadata['multi_agent'] else 'transitions'}: "
            "Minari's layout stores single-agent trajectories"
        )
    dataset_id = check_minari_id(dataset_id or default_minari_id(info.name))
    require_valid(info)
    target = minari_root() / dataset_id

    def check_target(path: Path) -> None:
        if os.path.islink(path) or (os.path.exists(path) and not _is_minari_dataset(path)):
            raise RlpipeError(f"{path} exists and is not a Minari dataset (a namespace or another directory); refusing to replace it")
        check_output_dir(path, "Minari dataset")  # a name too long, a namespace that is a file
        if path.exists() and not force:
            raise RlpipeError(f"Minari dataset {dataset_id!r} already exists at {target} (use --force to replace it)")

    staging = StagedDirectory(target, f"Minari dataset {dataset_id!r}", _is_minari_dataset, check_target)
    try:
        (staging.path / MINARI_DIR).mkdir()
        if info.hdf5_path is not None:
            for source in sorted((info.path / MINARI_DIR).iterdir()):
                shutil.copyfile(source, staging.path / MINARI_DIR / source.name)
        else:  # an Arrow-only dataset: Minari's layout written from the shards, one at a time
            write_minari_layout(
                staging.path,
                info.shard_paths,
                minari_metadata(info.name, info.metadata),
                info_space_of(info),
                info.metadata.get("episode_seeds"),
            )
        _set_minari_id(staging.path / MINARI_DIR / "metadata.json", dataset_id)
        return staging.commit()
    finally:
        staging.abort()


def _set_minari_id(metadata_path: Path, dataset_id: str) -> None:
    try:
        metadata = loads_json(metadata_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise RlpipeError(f"cannot read {metadata_path.name} of the exported copy: {exc}") from None
    if not isinstance(metadata, dict):
        raise RlpipeError(f"{metadata_path.name} of the exported copy is not a JSON object")
    metadata["dataset_id"] = dataset_id
    metadata_path.write_text(json.dumps(metadata, sort_keys=True))


def _info_space(infos: dict[str, Any], length: int) -> gym.spaces.Dict | None:
    """The `infos` entries an import keeps: numbers and booleans with one value per
    observation (Minari's layout: the reset info, then one per step), nested Dicts included."""
    kept: dict[str, gym.Space] = {}
    for key, value in sorted(infos.items()):
        space: gym.Space | None
        if isinstance(value, dict):
            space = _info_space(value, length)
        else:
            value = np.asarray(value)
            space = info_value_space(value[0]) if value.ndim >= 1 and len(value) == length else None
        if space is not None:
            kept[key] = space
    return gym.spaces.Dict(kept) if kept else None


def _select_infos(infos: dict[str, Any], space: gym.spaces.Dict, episode: int) -> Columnar:
    """The entries of `space` from one episode's infos, as arrays of the space's dtypes."""
    out: dict[str, Columnar] = {}
    for key, sub in space.spaces.items():
        if key not in infos:
            raise RlpipeError(f"Minari episode {episode} has no info {key!r}, which earlier episodes have")
        out[key] = _select_infos(infos[key], sub, episode) if isinstance(sub, gym.spaces.Dict) else np.asarray(infos[key], dtype=sub.dtype)
    return out


# What h5py, Minari and NumPy raise for a damaged or truncated source (h5py: OSError, KeyError,
# RuntimeError; Minari's decoding: AssertionError, TypeError; arrays of ragged data: ValueError).
_READ_ERRORS = (OSError, KeyError, RuntimeError, AssertionError, TypeError, ValueError, IndexError, AttributeError)


@contextmanager
def _reading(minari_dataset: Any, dataset_id: str) -> Iterator[None]:
    """Turn the errors of reading a damaged Minari dataset (a truncated HDF5 file, ...) into
    one RlpipeError naming its data files."""
    try:
        yield
    except _READ_ERRORS as exc:
        data_path = getattr(getattr(minari_dataset, "storage", None), "data_path", None)
        where: Any = dataset_id
        if data_path is not None:  # the HDF5 backend's one file, else the Arrow backend's folder
            where = Path(data_path) / MINARI_HDF5_FILE if (Path(data_path) / MINARI_HDF5_FILE).is_file() else data_path
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise RlpipeError(f"cannot read Minari dataset {dataset_id!r} ({where}): damaged or truncated ({reason})") from None


def _episode_rows(
    minari_dataset: Any, info_space: gym.spaces.Dict | None, batch_episodes: int, dataset_id: str = "the source"
) -> Iterator[dict[str, Columnar]]:
    """Row batches of the non-empty episodes, numbered 0, 1, 2, ... in Minari's order; a
    damaged source is one RlpipeError (`_reading`)."""
    parts: list[dict[str, Columnar]] = []
    number = 0
    with _reading(minari_dataset, dataset_id):
        episodes = iter(minari_dataset.iterate_episodes())
    while True:
        with _reading(minari_dataset, dataset_id):
            episode = next(episodes, None)
            if episode is None:
                break
            part = _episode_part(episode, number, info_space)
        if part is None:
            continue
        parts.append(part)
        number += 1
        if len(parts) == batch_episodes:
            yield {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}
            parts = []
    if parts:
        yield {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}


def _episode_part(episode: Any, number: int, info_space: gym.spaces.Dict | None) -> dict[str, Columnar] | None:
    """One Minari episode's rows as episode `number` (None for an empty episode)."""
    length = len(episode.rewards)
    if length == 0:
        return None
    observations = episode.observations
    part: dict[str, Columnar] = {
        "episode_id": np.full(length, number, dtype=np.int64),
        "step": np.arange(length, dtype=np.int32),
        "obs": map_columnar(observations, lambda a: np.asarray(a)[:-1]),
        "action": np.asarray(episode.actions),
        "reward": np.asarray(episode.rewards, dtype=np.float32),
        "next_obs": map_columnar(observations, lambda a: np.asarray(a)[1:]),
        "terminated": np.asarray(episode.terminations, dtype=bool),
        "truncated": np.asarray(episode.truncations, dtype=bool),
    }
    if info_space is not None:
        infos = _select_infos(episode.infos, info_space, episode.id)
        part["info"] = map_columnar(infos, lambda a: a[:-1])
        part["next_info"] = map_columnar(infos, lambda a: a[1:])
    return part


def _minari_extras(source: Any) -> dict[str, Any]:
    """Minari's optional metadata (authors as sorted lists) and the episodes' seeds, by our episode id."""
    metadata = source.storage.metadata
    extra = {key: metadata[key] for key in MINARI_METADATA_KEYS if metadata.get(key) is not None}
    for key in ("author", "author_email"):
        if key in extra:
            extra[key] = sorted(extra[key])
    episodes = [meta for meta in source.storage.get_episode_metadata(source.episode_indices) if meta.get("total_steps", 1) > 0]
    seeds = {str(number): int(meta["seed"]) for number, meta in enumerate(episodes) if meta.get("seed") is not None}
    return {**extra, **({"episode_seeds": seeds} if seeds else {})}


def import_from_minari(dataset_id: str, name: str, *, store: Any = None, fmt: str = "both", force: bool = False) -> Path:
    """Convert the local Minari dataset `dataset_id` into rlpipe dataset `name`, keeping its
    env spec, Minari's optional metadata, episode seeds and the numeric `infos` entries."""
    import minari

    check_name(name)  # before any work
    try:
        source = minari.load_dataset(check_minari_id(dataset_id))
    except (FileNotFoundError, ValueError) as exc:
        raise RlpipeError(f"cannot open Minari dataset {dataset_id!r}: {exc}") from None
    with _reading(source, dataset_id):  # Minari opens its data files lazily: a damaged one fails here or below
        env_spec = source.env_spec
        producer = {
            "algorithm": source.storage.metadata.get("algorithm_name") or "unknown",
            "imported_from": f"minari:{dataset_id}",
            "minari_version": source.minari_version,
            "checkpoint_sha256": None,
        }
        first = next(iter(source.iterate_episodes(source.episode_indices[:1])), None)
        info_space = None if first is None else _info_space(first.infos or {}, len(first.rewards) + 1)
        extra = _minari_extras(source)
        observation_space, action_space = source.observation_space, source.action_space
    return write_rows(
        name,
        _episode_rows(source, info_space, batch_episodes=1000, dataset_id=dataset_id),
        observation_space,
        action_space,
        env_id=env_spec.id if env_spec is not None else None,
        env_spec=env_spec.to_json() if env_spec is not None else None,  # the source's time limit and kwargs, not ours
        info_space=info_space,
        producer=producer,
        extra=extra,
        store=store,
        fmt=fmt,
        force=force,
    )
