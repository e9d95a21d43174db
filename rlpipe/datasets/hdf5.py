"""Minari's HDF5 layout, written from our Arrow shards so `minari.load_dataset` reads it.

Layout (Minari 0.5): `data/main_data.hdf5` with one group `episode_{i}` per episode holding
`observations` (steps + 1 rows: the final observation is appended), `actions`, `rewards`,
`terminations`, `truncations` and an `infos` group; Dict spaces become sub-groups. Minari's
own `data/metadata.json` sits beside it. Timestamps are off so the bytes are reproducible.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import h5py
import minari
import numpy as np
from minari.serialization import deserialize_space

from rlpipe.datasets.loader import read_shard
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.datasets.store import MINARI_DIR, MINARI_HDF5_FILE, MINARI_METADATA_FILE
from rlpipe.errors import RlpipeError


def default_minari_id(name: str) -> str:
    """The Minari id of dataset `name`: `rlpipe/<name>-v0` (or `rlpipe/<name>` when it already
    ends in `-v<N>`), with characters Minari ids refuse (`.`) turned into `_`.

    Minari parses every id as `(namespace/)name-v<N>`; an id without a version breaks
    `.spec`, `minari show` and `minari list local` for the whole root.
    """
    base = re.sub(r"[^-\w]", "_", name)
    return f"rlpipe/{base}" if re.search(r"-v\d+$", base) else f"rlpipe/{base}-v0"


def check_minari_id(dataset_id: str) -> str:
    """Return `dataset_id` if Minari accepts it, with its version; else a one-line RlpipeError."""
    from minari.dataset.minari_dataset import DATASET_ID_RE

    match = DATASET_ID_RE.fullmatch(dataset_id)
    if match is None or match.group("version") is None:
        raise RlpipeError(f"invalid Minari dataset id {dataset_id!r}: Minari ids are (namespace/)name-v<N>, e.g. rlpipe/{dataset_id.rsplit('/', 1)[-1]}-v0")
    return dataset_id


def _with_final_observations(obs: Columnar, next_obs: Columnar, starts: np.ndarray, count: int) -> Columnar:
    """Interleave each episode's last next_obs after its observations (Minari stores steps + 1)."""
    episode_of_row = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, count]))
    ends = np.r_[starts[1:], count] - 1

    def merge(current: Columnar, following: Columnar) -> Columnar:
        if isinstance(current, dict):  # Dict spaces nest to any depth
            return {key: merge(current[key], following[key]) for key in current}
        out = np.empty((count + len(starts),) + current.shape[1:], dtype=current.dtype)
        out[np.arange(count) + episode_of_row] = current
        out[ends + np.arange(len(starts)) + 1] = following[ends]
        return out

    return merge(obs, next_obs)


def _chained(obs: Columnar, next_obs: Columnar, starts: np.ndarray, count: int) -> bool:
    """Whether next_obs[t] == obs[t + 1] inside every episode (what Minari's layout assumes)."""
    inner = np.ones(count - 1, dtype=bool)
    inner[starts[1:] - 1] = False
    if isinstance(obs, dict):
        return all(_chained(obs[key], next_obs[key], starts, count) for key in obs)
    return bool(np.array_equal(next_obs[:-1][inner], obs[1:][inner]))


def _write_leaves(group: h5py.Group, name: str, values: Columnar) -> None:
    if isinstance(values, dict):
        sub = group.create_group(name)
        for key, child in values.items():
            _write_leaves(sub, key, child)
    else:
        group.create_dataset(name, data=values, track_times=False)


def write_minari_layout(dataset_dir: Path, shard_rels: list[str], minari_metadata: dict[str, Any]) -> list[str]:
    """Write `data/main_data.hdf5` and Minari's `data/metadata.json` from the Arrow shards.

    Returns the written paths relative to `dataset_dir`. Shards hold whole episodes with
    ids 0..E-1 in order, which Minari requires for its `episode_{i}` groups.
    """
    obs_space = deserialize_space(minari_metadata["observation_space"])
    act_space = deserialize_space(minari_metadata["action_space"])
    data_dir = dataset_dir / MINARI_DIR
    data_dir.mkdir(exist_ok=True)
    total_episodes = total_steps = 0
    with h5py.File(data_dir / MINARI_HDF5_FILE, "w") as file:
        for rel in shard_rels:
            rows = read_shard(dataset_dir / rel, obs_space, act_space)
            episode_id, count = rows["episode_id"], len(rows["reward"])
            starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
            if episode_id[0] != total_episodes or not np.array_equal(episode_id[starts], np.arange(len(starts)) + total_episodes):
                raise RlpipeError("Minari's HDF5 layout needs episode ids 0, 1, 2, ... in order: use --format arrow")
            if not _chained(rows["obs"], rows["next_obs"], starts, count):
                raise RlpipeError("Minari's HDF5 layout stores trajectories, but next_obs differs from the next row's obs within an episode: use --format arrow")
            observations = _with_final_observations(rows["obs"], rows["next_obs"], starts, count)
            bounds = np.r_[starts, count]
            for index, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
                group = file.create_group(f"episode_{total_episodes + index}")
                group.attrs["id"] = total_episodes + index
                group.attrs["total_steps"] = end - begin
                _write_leaves(group, "observations", map_columnar(observations, lambda a: a[begin + index : end + index + 1]))
                _write_leaves(group, "actions", map_columnar(rows["action"], lambda a: a[begin:end]))
                _write_leaves(group, "rewards", rows["reward"][begin:end])
                _write_leaves(group, "terminations", rows["terminated"][begin:end])
                _write_leaves(group, "truncations", rows["truncated"][begin:end])
                group.create_group("infos")
            total_episodes += len(starts)
            total_steps += count
    metadata = {
        **minari_metadata,
        "total_episodes": total_episodes,
        "total_steps": total_steps,
        "data_format": "hdf5",
        "jpeg_encoding": False,
        "minari_version": minari.__version__,
        # Minari's size of data/ in MB (one decimal); `minari list local` needs it for every dataset.
        "dataset_size": round((data_dir / MINARI_HDF5_FILE).stat().st_size / 1e6, 1),
    }
    if metadata.get("env_spec") is None:
        metadata.pop("env_spec", None)
    (dataset_dir / MINARI_METADATA_FILE).write_text(json.dumps(metadata, sort_keys=True))
    return [f"{MINARI_DIR}/{MINARI_HDF5_FILE}", MINARI_METADATA_FILE]

