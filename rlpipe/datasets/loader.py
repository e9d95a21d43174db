"""Loading a dataset for training: memory-mapped Arrow shards into contiguous numpy arrays.

Torch-free; the torch sampler over these arrays is `rlpipe.training.sampler.TransitionSampler`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
from minari.serialization import deserialize_space

from rlpipe.datasets.schema import INFO_COLUMNS, Columnar, concat_columnar, from_arrow, map_columnar, scalar_from_arrow
from rlpipe.datasets.store import DatasetInfo, open_dataset
from rlpipe.errors import RlpipeError


@dataclass
class TransitionArrays:
    """A whole dataset as contiguous arrays, one row per transition (Dict observations as dicts)."""

    obs: Columnar
    action: Columnar
    reward: np.ndarray
    next_obs: Columnar
    terminated: np.ndarray
    truncated: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    agent: np.ndarray | None = None
    info: Columnar | None = None  # selected env info keys (metadata `info_space`), with obs
    next_info: Columnar | None = None  # ... and with next_obs

    def __len__(self) -> int:
        return len(self.reward)

    def episode_starts(self) -> np.ndarray:
        """Row index where each episode begins (rows are sorted by episode_id, step)."""
        ids = self.episode_id
        return np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])

    def episode_returns(self) -> np.ndarray:
        """The undiscounted return of each episode, in episode order."""
        return np.add.reduceat(self.reward.astype(np.float64), self.episode_starts())


def _read_shard(path: Path) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        if reader.num_record_batches == 1:
            return reader.get_batch(0)
        # Shards written by other tools may hold several batches: merge them (one copy).
        return reader.read_all().combine_chunks().to_batches()[0]
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise RlpipeError(f"corrupted shard {path}: {exc} (run `rlpipe datasets validate`)") from None


def read_shard(
    path: Path, observation_space: gym.Space, action_space: gym.Space, info_space: gym.spaces.Dict | None = None
) -> dict[str, Columnar]:
    """One shard's columns as numpy arrays (zero-copy views of the memory map where possible)."""
    batch = _read_shard(path)
    columns = {
        "obs": from_arrow(batch.column("obs"), observation_space),
        "action": from_arrow(batch.column("action"), action_space),
        "next_obs": from_arrow(batch.column("next_obs"), observation_space),
    }
    for name in ("reward", "terminated", "truncated", "episode_id", "step"):
        columns[name] = scalar_from_arrow(batch.column(name))
    if "agent" in batch.schema.names:
        columns["agent"] = batch.column("agent").to_numpy(zero_copy_only=False)
    if info_space is not None:
        columns.update({name: from_arrow(batch.column(name), info_space) for name in INFO_COLUMNS})
    return columns


def info_space_of(info: DatasetInfo) -> gym.spaces.Dict | None:
    """The space of a dataset's `info`/`next_info` columns (None when it stores no infos)."""
    serialized = info.metadata.get("info_space")
    return None if serialized is None else deserialize_space(serialized)


def checked_shard_paths(info: DatasetInfo) -> list[Path]:
    """The dataset's step shards, each present with the size its metadata records."""
    expected = info.metadata["files"]
    for path in info.shard_paths:
        rel = path.relative_to(info.path).as_posix()
        if not path.is_file():
            raise RlpipeError(f"dataset {info.name!r} is missing {rel} (run `rlpipe datasets validate`)")
        if path.stat().st_size != expected[rel]["bytes"]:
            raise RlpipeError(f"corrupted shard {path}: size differs from metadata (truncated or modified)")
    if not info.shard_paths:
        raise RlpipeError(f"dataset {info.name!r} has no step shards")
    return info.shard_paths


def load_shards(info: DatasetInfo) -> TransitionArrays:
    """Load all shards of a dataset into TransitionArrays.

    A single shard is returned zero-copy (read-only views of the memory map) except for
    boolean columns, which Arrow bit-packs; several shards are concatenated once.
    """
    obs_space, act_space = info.observation_space, info.action_space
    parts = [read_shard(path, obs_space, act_space, info_space_of(info)) for path in checked_shard_paths(info)]
    merged = {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}
    return TransitionArrays(**merged)


def load_dataset(name: str, store: str | os.PathLike | None = None) -> TransitionArrays:
    """Load dataset `name` from the store into contiguous arrays (memory-mapped, see load_shards)."""
    return load_shards(open_dataset(name, store))
