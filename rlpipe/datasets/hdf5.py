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

import gymnasium as gym
import minari
import numpy as np
from minari.serialization import deserialize_space

from rlpipe.datasets.loader import read_shard
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.datasets.store import MINARI_DIR, MINARI_HDF5_FILE, MINARI_METADATA_FILE
from rlpipe.errors import RlpipeError

# Minari's optional dataset metadata, kept under the same names in our metadata.json and
# copied both ways by import and export (Minari's meanings: see minari.create_dataset_from_buffers).
MINARI_METADATA_KEYS = (
    "author",
    "author_email",
    "code_permalink",
    "description",
    "eval_env_spec",
    "num_episodes_average_score",
    "ref_max_score",
    "ref_min_score",
    "requirements",
)


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
    if any(part in ("", ".", "..") for part in dataset_id.split("/")):
        raise RlpipeError(f"Minari dataset id {dataset_id!r} must stay inside Minari's dataset root")
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


class _LowLevelWriter:
    """Groups, datasets and scalar attributes through h5py's low-level API.

    Minari's layout is a group per episode with ~6 datasets and ~7 attributes; h5py's
    high-level calls cost about twice the HDF5 work per object (random CartPole, 45k short
    episodes: 1.1 ms against 0.55 ms per episode), and the layout is many small objects.
    """

    def __init__(self) -> None:
        import h5py  # only writing HDF5 needs it (0.1-0.5 s of start-up)

        self._h5 = h5py
        self._dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        self._dcpl.set_obj_track_times(False)  # reproducible bytes
        self._scalar = h5py.h5s.create(h5py.h5s.SCALAR)
        self._types: dict[np.dtype, Any] = {}

    def create_file(self, path: Path) -> Any:
        """A new (truncated) HDF5 file, as an h5py.File."""
        return self._h5.File(path, "w")

    def _type(self, dtype: np.dtype) -> Any:
        if dtype not in self._types:
            self._types[dtype] = self._h5.h5t.py_create(dtype, logical=True)
        return self._types[dtype]

    def group(self, parent: Any, name: str) -> Any:
        return self._h5.h5g.create(parent, name.encode())

    def leaves(self, parent: Any, name: str, values: Columnar) -> None:
        """`values` as dataset `name` (Dict columns as sub-groups, to any depth)."""
        if isinstance(values, dict):
            sub = self.group(parent, name)
            for key, child in values.items():
                self.leaves(sub, key, child)
            return
        values = np.ascontiguousarray(values)
        h5 = self._h5
        space = h5.h5s.create_simple(values.shape) if values.shape else self._scalar
        dataset = h5.h5d.create(parent, name.encode(), self._type(values.dtype), space, dcpl=self._dcpl)
        dataset.write(h5.h5s.ALL, h5.h5s.ALL, values)

    def attribute(self, parent: Any, name: str, value: Any) -> None:
        value = np.asarray(value)
        self._h5.h5a.create(parent, name.encode(), self._type(value.dtype), self._scalar).write(value)


def _episode_statistics(rewards: np.ndarray) -> dict[str, float]:
    """What Minari's default `EpisodeMetadataCallback` records on every episode group."""
    rewards = rewards.astype(np.float64)
    return {
        "rewards_sum": float(rewards.sum()),
        "rewards_mean": float(rewards.mean()),
        "rewards_std": float(rewards.std()),
        "rewards_max": float(rewards.max()),
        "rewards_min": float(rewards.min()),
    }


def write_minari_layout(
    dataset_dir: Path,
    shard_rels: list[str],
    minari_metadata: dict[str, Any],
    info_space: gym.spaces.Dict | None = None,
    episode_seeds: dict[str, int] | None = None,
) -> list[str]:
    """Write `data/main_data.hdf5` and Minari's `data/metadata.json` from the Arrow shards.

    Returns the written paths relative to `dataset_dir`. Shards hold whole episodes with
    ids 0..E-1 in order, which Minari requires for its `episode_{i}` groups. Each group
    gets Minari's per-episode attributes (`id`, `total_steps`, `seed` where known, reward
    statistics) and `infos` with one entry per observation (the `info`/`next_info` columns).
    """
    obs_space = deserialize_space(minari_metadata["observation_space"])
    act_space = deserialize_space(minari_metadata["action_space"])
    seeds = episode_seeds or {}
    data_dir = dataset_dir / MINARI_DIR
    data_dir.mkdir(exist_ok=True)
    total_episodes = total_steps = 0
    writer = _LowLevelWriter()
    with writer.create_file(data_dir / MINARI_HDF5_FILE) as file:
        for rel in shard_rels:
            rows = read_shard(dataset_dir / rel, obs_space, act_space, info_space)
            episode_id, count = rows["episode_id"], len(rows["reward"])
            starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
            if episode_id[0] != total_episodes or not np.array_equal(episode_id[starts], np.arange(len(starts)) + total_episodes):
                raise RlpipeError("Minari's HDF5 layout needs episode ids 0, 1, 2, ... in order: use --format arrow")
            chained = _chained(rows["obs"], rows["next_obs"], starts, count)
            if not chained or (info_space is not None and not _chained(rows["info"], rows["next_info"], starts, count)):
                raise RlpipeError("Minari's HDF5 layout stores trajectories, but next_obs differs from the next row's obs within an episode: use --format arrow")
            observations = _with_final_observations(rows["obs"], rows["next_obs"], starts, count)
            infos = {} if info_space is None else _with_final_observations(rows["info"], rows["next_info"], starts, count)
            bounds = np.r_[starts, count]
            for index, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
                number = total_episodes + index
                group = writer.group(file.id, f"episode_{number}")
                attributes = {"id": number, "total_steps": end - begin, **_episode_statistics(rows["reward"][begin:end])}
                if str(number) in seeds:
                    attributes["seed"] = seeds[str(number)]
                for key in sorted(attributes):  # Minari reads them by name; a fixed order keeps the bytes fixed
                    writer.attribute(group, key, attributes[key])
                with_final = slice(begin + index, end + index + 1)
                writer.leaves(group, "observations", map_columnar(observations, lambda a: a[with_final]))
                writer.leaves(group, "actions", map_columnar(rows["action"], lambda a: a[begin:end]))
                writer.leaves(group, "rewards", rows["reward"][begin:end])
                writer.leaves(group, "terminations", rows["terminated"][begin:end])
                writer.leaves(group, "truncations", rows["truncated"][begin:end])
                writer.leaves(group, "infos", map_columnar(infos, lambda a: a[with_final]))
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
