"""Exporting a dataset to files other tools read: Parquet (one row per transition, loadable
with Hugging Face `datasets`), D4RL's HDF5 layout, the same arrays in a NumPy .npz, OGBench's
.npz layout and a LeRobotDataset v3 directory.
The reverse of `rlpipe.datasets.imports`; Minari's layout is `rlpipe.datasets.minari_io`'s.

The file is written from the verified shards one at a time (the loader's `ShardVerifier`:
every check loading runs), so memory holds one shard (at most the writer's 256 MiB, images
decoded) and one row group, whatever the dataset's size. It goes to a temporary file beside
the output, renamed over it once complete (`rlpipe.storage.files.atomic_output`): a failure, a
corrupted shard included, leaves no file behind.

What each format carries:
- parquet: every row's episode_id, step, obs, action, reward, next_obs, terminated,
  truncated, in the store's dtypes. Box values are fixed-size lists of their flattened
  values (images too), the shape in the field's metadata (`shape`, JSON); Discrete actions
  are int64, Dict observations structs of such lists. The dataset's metadata.json (spaces,
  env id, producer) is the file's key-value metadata under `rlpipe.metadata`.
- d4rl, npz: D4RL's arrays (`rlpipe.datasets.d4rl.d4rl_arrays`): observations, actions,
  rewards, next_observations, terminals, timeouts. Floats are float32 as in D4RL's files
  (float64 observations lose precision), integers keep their dtype (Discrete actions int64).
  No episode ids, steps, spaces or env id: an import recovers episodes from terminals and
  timeouts, and a step both terminated and truncated is a terminal only (D4RL's convention).
- ogbench: OGBench's .npz layout, which `ogbench.load_dataset` reads: per episode, its rows'
  observations then its final next_obs as a row of its own, `terminals` (float32) 1.0 on that
  final-state row, else 0; its action repeats the episode's last one (OGBench drops it, and a
  compact dataset's statistics stay within the actions taken). Also, for rlpipe's importer,
  `rewards` and `terminations` (float32, 0 on the final-state rows): OGBench's loader reads
  only observations, actions and terminals, so it gives no rewards and every trajectory ends
  alike; rlpipe's importer takes a trajectory's end as truncated unless `terminations` says it
  terminated (a step both terminated and truncated is terminated only, as in D4RL's arrays;
  no `timeouts`: every end is a final-state row, and one not terminated was truncated). Floats as float32, as d4rl; Box observations only (OGBench's states and uint8 images). The
  layout stores each state once, which an episodes dataset's chained rows allow (the loader
  checks them); a transitions dataset (HER's relabelled rows) is refused, as by lerobot. No
  episode ids, steps, spaces or env id.
- lerobot: a LeRobotDataset v3 directory (meta/info.json, meta/stats.json, meta/tasks.parquet,
  meta/episodes/chunk-000/file-000.parquet, data/chunk-NNN/file-NNN.parquet), one frame per
  transition: `observation.state` (a 1-D Box) or `observation.image` (uint8 H x W x 3, PNG),
  `action` (Box or MultiDiscrete lists, Discrete int64), `next.reward`, `next.done`
  (terminated), `next.truncated`, and LeRobot's timestamp, frame_index, episode_index, index
  and task_index (one task: the env id). Episodes are renumbered 0..E-1; metadata.json rides in
  the data files' key-value metadata as in parquet, so an import gets the spaces and env back.
  No next observations (LeRobot has none: an import takes the next frame's), no frame rate
  (`LEROBOT_FPS`), and stats.json holds min, max, mean, std and count (no quantiles).
  The directory is built beside --out and renamed into place (`StagedDirectory`).
None carries the info/next_info columns; multi-agent datasets are refused.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.d4rl import d4rl_arrays
from rlpipe.datasets.loader import ShardVerifier, TransitionArrays
from rlpipe.datasets.schema import SPACE_COLUMNS, Columnar, leaf_shape, map_columnar, step_schema, to_arrow
from rlpipe.datasets.store import DatasetInfo
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import StagedDirectory
from rlpipe.storage.files import atomic_output, check_output_dir, check_output_file

EXPORT_FORMATS = ("minari", "parquet", "d4rl", "npz", "ogbench", "lerobot")
FILE_FORMATS = EXPORT_FORMATS[1:]  # written to --out (lerobot: a directory); minari goes to Minari's dataset root
METADATA_KEY = "rlpipe.metadata"  # the Parquet key-value metadata holding metadata.json
ROW_GROUP_BYTES = 64 << 20  # a row group's bytes, about (rows sized by the shards' bytes per row): readers hold one at a time

Append = Callable[[dict[str, Columnar]], None]  # takes a shard's columns
EPISODE_LAYOUTS = {"ogbench": "OGBench's layout", "lerobot": "LeRobot's layout"}  # the targets that store whole episodes


def export_file(info: DatasetInfo, out: str | os.PathLike, target: str, *, force: bool = False) -> int:
    """Write dataset `info` to the file `out` as `target` (parquet, d4rl, npz or ogbench; lerobot:
    the directory `out`; the module doc says what each carries); returns the transitions written.
    An existing `out` is replaced only with `force` (a FIFO or a character device, e.g.
    /dev/stdout, is written through; lerobot replaces only a LeRobot dataset); each refusal is
    one RlpipeError raised before anything is written."""
    if target not in FILE_FORMATS:
        raise RlpipeError(f"unknown export target {target!r}: choose one of {', '.join(EXPORT_FORMATS)}")
    if info.metadata["multi_agent"]:
        raise RlpipeError(f"dataset {info.name!r} holds multi-agent rows: the file formats hold one agent's transitions")
    if target in EPISODE_LAYOUTS and info.metadata.get("kind") == "transitions":
        raise RlpipeError(f"dataset {info.name!r} holds transitions, not whole episodes: {EPISODE_LAYOUTS[target]} stores episodes")
    if target == "lerobot":
        return _export_lerobot(info, Path(out), force)
    obs = info.observation_space
    if target != "parquet" and isinstance(obs, gym.spaces.Dict):
        layout = EPISODE_LAYOUTS.get(target, "D4RL's layout")
        raise RlpipeError(f"dataset {info.name!r} has Dict observations: {layout} holds arrays (export it --to parquet)")
    if target == "ogbench" and not isinstance(obs, gym.spaces.Box):
        raise RlpipeError(f"dataset {info.name!r} has observations {obs}: OGBench's layout holds Box observations (states or images)")
    out = Path(out)
    through = check_output_file(out, "--out")
    if not through and os.path.lexists(out) and not force:
        raise RlpipeError(f"{out} exists (use --force to replace it)")
    rows = 0
    with atomic_output(out) as tmp, _file_writer(target, tmp, info) as append:
        for columns in _shards(info):
            append(columns)
            rows += len(columns["reward"])
    return rows


def _shards(info: DatasetInfo) -> Iterator[dict[str, Columnar]]:
    """Each shard's columns, verified as loading verifies them, then the dataset's counts."""
    verifier = ShardVerifier(info)
    for rel in info.shard_rels:
        yield verifier.read(rel)
    verifier.finish()


def _file_writer(target: str, path: Path, info: DatasetInfo) -> AbstractContextManager[Append]:
    if target == "parquet":
        return _parquet_rows(path, info)
    if target == "ogbench":
        return _ogbench_rows(path)
    return _d4rl_rows(path, npz=target == "npz")


# ---- Parquet ---------------------------------------------------------------------------------


def parquet_schema(info: DatasetInfo) -> pa.Schema:
    """The step table's schema (`step_schema`: no agent, info or compressed columns), each list
    column's shape in its field's metadata and metadata.json in the schema's."""
    spaces = {"obs": info.observation_space, "action": info.action_space, "next_obs": info.observation_space}
    schema = step_schema(spaces["obs"], spaces["action"])
    for name, space in spaces.items():
        shape = _shape(space)
        if shape:  # a scalar (Discrete) column has none
            index = schema.get_field_index(name)
            schema = schema.set(index, schema.field(index).with_metadata({"shape": json.dumps(shape)}))
    return schema.with_metadata({METADATA_KEY: json.dumps(info.metadata, sort_keys=True)})


def _shape(space: gym.Space) -> Any:
    """A column's per-row shape, a dict of them for a Dict space."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _shape(sub) for key, sub in space.spaces.items()}
    return list(leaf_shape(space))


@contextmanager
def _parquet_rows(path: Path, info: DatasetInfo) -> Iterator[Append]:
    """Append shards as row groups of at most ROW_GROUP_BYTES (as stored; decoded images count whole)."""
    import pyarrow.parquet as pq

    schema = parquet_schema(info)
    spaces = {"obs": info.observation_space, "action": info.action_space, "next_obs": info.observation_space}
    group_rows = max(1, ROW_GROUP_BYTES * max(1, info.metadata["total_steps"]) // max(1, info.step_bytes))

    def append(columns: dict[str, Columnar]) -> None:
        count = len(columns["reward"])
        for start in range(0, count, group_rows):
            part = {name: map_columnar(columns[name], lambda values: values[start : start + group_rows]) for name in schema.names}
            arrays = [
                to_arrow(part[field.name], spaces[field.name]) if field.name in SPACE_COLUMNS else pa.array(part[field.name], field.type)
                for field in schema
            ]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema), row_group_size=group_rows)

    with pq.ParquetWriter(path, schema) as writer:
        yield append


# ---- D4RL's arrays: HDF5 and .npz -----------------------------------------------------------


@contextmanager
def _d4rl_rows(path: Path, npz: bool) -> Iterator[Append]:
    """Append shards as D4RL's arrays (`d4rl_arrays`), floats as float32 as D4RL stores them."""
    with _npz_arrays(path) if npz else _hdf5_arrays(path) as append:

        def append_shard(columns: dict[str, Columnar]) -> None:
            arrays = d4rl_arrays(TransitionArrays(**cast("dict[str, Any]", columns)))  # a shard's columns are its fields
            append({key: _float32(values) for key, values in arrays.items()})

        yield append_shard


def _float32(values: np.ndarray) -> np.ndarray:
    """Floats as float32, as D4RL's and OGBench's files store them; other dtypes as they are."""
    return values.astype(np.float32, copy=False) if values.dtype.kind == "f" else values


@contextmanager
def _hdf5_arrays(path: Path) -> Iterator[Callable[[dict[str, np.ndarray]], None]]:
    """Top-level HDF5 datasets, as D4RL's files have them, grown by each append."""
    import h5py

    with h5py.File(path, "w") as file:

        def append(arrays: dict[str, np.ndarray]) -> None:
            for key, values in arrays.items():
                if key not in file:
                    file.create_dataset(key, (0, *values.shape[1:]), values.dtype, maxshape=(None, *values.shape[1:]), chunks=True)
                stored = file[key]
                stored.resize(len(stored) + len(values), axis=0)
                stored[len(stored) - len(values) :] = values

        yield append


@contextmanager
def _npz_arrays(path: Path) -> Iterator[Callable[[dict[str, np.ndarray]], None]]:
    """Members of an .npz (uncompressed, as `np.savez` writes it). A zip is written one member
    at a time, so each array's rows go to a raw file beside `path` first, then behind its
    .npy header into the zip once every row is known (twice the file's size on disk a while)."""
    layout: dict[str, tuple[np.dtype, tuple[int, ...], int]] = {}  # dtype, row shape, rows
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".tmp-{os.getpid()}-") as folder:
        parts = Path(folder)

        def append(arrays: dict[str, np.ndarray]) -> None:
            for key, values in arrays.items():
                with open(parts / key, "ab") as raw:
                    raw.write(np.ascontiguousarray(values).data)
                rows = layout[key][2] if key in layout else 0
                layout[key] = (values.dtype, values.shape[1:], rows + len(values))

        yield append
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, (dtype, shape, rows) in layout.items():
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, *shape)}
                with archive.open(f"{key}.npy", "w", force_zip64=True) as member, open(parts / key, "rb") as raw:
                    np.lib.format.write_array_header_1_0(member, header)
                    shutil.copyfileobj(raw, member, 1 << 22)


# ---- OGBench's .npz layout -------------------------------------------------------------------

_OGBENCH_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "episode_id")


@contextmanager
def _ogbench_rows(path: Path) -> Iterator[Append]:
    """Append shards in OGBench's layout (module doc) to the .npz `path` (`_npz_arrays`). The
    last row seen waits for the next shard, which says whether its episode goes on."""
    held: dict[str, np.ndarray] | None = None
    with _npz_arrays(path) as write:

        def append(shard: dict[str, Columnar]) -> None:
            nonlocal held
            rows = {column: np.asarray(shard[column]) for column in _OGBENCH_COLUMNS}
            if held is not None:
                rows = {column: np.concatenate([held[column], values]) for column, values in rows.items()}
            if not len(rows["reward"]):
                return
            ids = rows["episode_id"]
            ends = np.flatnonzero(ids[1:] != ids[:-1])  # rows that end their episode, the last one aside
            write(_ogbench_arrays({column: values[:-1] for column, values in rows.items()}, ends))
            held = {column: values[-1:] for column, values in rows.items()}

        yield append
        if held is not None:  # the dataset's last row ends its episode
            write(_ogbench_arrays(held, np.zeros(1, np.int64)))


def _ogbench_arrays(rows: dict[str, np.ndarray], ends: np.ndarray) -> dict[str, np.ndarray]:
    """`rows` as OGBench's arrays, with after each row in `ends` (its episode's last) the
    episode's final state, whose action repeats that row's."""
    after = ends + 1
    return {
        "observations": _float32(np.insert(rows["obs"], after, rows["next_obs"][ends], axis=0)),
        "actions": _float32(np.insert(rows["action"], after, rows["action"][ends], axis=0)),
        "terminals": np.insert(np.zeros(len(rows["obs"]), np.float32), after, 1.0),
        "rewards": _float32(np.insert(rows["reward"], after, 0)),
        "terminations": np.insert(rows["terminated"].astype(np.float32), after, 0.0),
    }


# ---- LeRobotDataset v3 ------------------------------------------------------------------------

LEROBOT_VERSION = "v3.0"
LEROBOT_FPS = 30  # rlpipe records no frame rate and info.json needs one: timestamp = frame_index / fps
LEROBOT_CHUNK_FILES = 1000  # files per chunk-NNN folder (LeRobot's chunks_size)
LEROBOT_FILE_BYTES = 100 << 20  # a data file's Arrow bytes before the next episode opens a new one (LeRobot's 100 MB)
LEROBOT_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
LEROBOT_EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
LEROBOT_INFO_PATH = "meta/info.json"
LEROBOT_STATE, LEROBOT_IMAGE = "observation.state", "observation.image"
_SCALAR_FEATURE = {"shape": [1], "names": None}  # LeRobot stores a shape-(1,) feature as a scalar column
LEROBOT_INDEX_FEATURES = {  # LeRobot's DEFAULT_FEATURES, which every v3 dataset has
    "timestamp": {"dtype": "float32", **_SCALAR_FEATURE},
    **{key: {"dtype": "int64", **_SCALAR_FEATURE} for key in ("frame_index", "episode_index", "index", "task_index")},
}
# The pandas index record LeRobot's tasks.parquet carries (pandas reads the `task` column back as the index).
_TASKS_PANDAS_METADATA = {
    "index_columns": ["task"],
    "column_indexes": [],
    "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
        {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
    ],
}


def is_lerobot_dataset(path: Path) -> bool:
    """Whether `path` holds a LeRobot dataset's meta/info.json."""
    return (path / LEROBOT_INFO_PATH).is_file()


def _export_lerobot(info: DatasetInfo, out: Path, force: bool) -> int:
    """Write `info` as the LeRobotDataset v3 directory `out` (module doc), built beside it and
    renamed into place; `force` replaces only a LeRobot dataset. Returns the frames written."""
    features = _lerobot_features(info)

    def check_target(path: Path) -> None:
        if os.path.islink(path) or (os.path.exists(path) and not is_lerobot_dataset(path)):
            raise RlpipeError(f"{path} exists and is not a LeRobot dataset; refusing to replace it")
        check_output_dir(path, "--out")
        if path.exists() and not force:
            raise RlpipeError(f"{path} exists (use --force to replace it)")

    staging = StagedDirectory(out, f"LeRobot dataset {out}", is_lerobot_dataset, check_target)
    try:
        writer = _LeRobotWriter(staging.path, features, info.env_id or info.name, json.dumps(info.metadata, sort_keys=True))
        for episode in _whole_episodes(_shards(info)):
            writer.add(episode)
        writer.finish()
        staging.commit()
        return writer.frames
    finally:
        staging.abort()


def _lerobot_features(info: DatasetInfo) -> dict[str, dict[str, Any]]:
    """info.json's features: the observation's (state or image) first, then action, next.reward,
    next.done, next.truncated and LeRobot's index features; other spaces are one refusal."""
    obs, action = info.observation_space, info.action_space
    if isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1:
        observation = {LEROBOT_STATE: _vector_feature(obs.dtype, obs.shape[0])}
    elif isinstance(obs, gym.spaces.Box) and obs.dtype == np.uint8 and len(obs.shape) == 3 and obs.shape[2] == 3:
        observation = {LEROBOT_IMAGE: {"dtype": "image", "shape": list(obs.shape), "names": ["height", "width", "channels"]}}
    else:
        raise RlpipeError(
            f"dataset {info.name!r} has observations {obs}: the LeRobot export writes vector states (a 1-D Box) "
            "and RGB images (a uint8 Box of height x width x 3)"
        )
    if isinstance(action, gym.spaces.Discrete):
        action_feature = {"dtype": "int64", **_SCALAR_FEATURE}
    elif isinstance(action, (gym.spaces.Box, gym.spaces.MultiDiscrete)) and len(action.shape) == 1:
        action_feature = _vector_feature(action.dtype, action.shape[0])
    else:
        raise RlpipeError(
            f"dataset {info.name!r} has actions {action}: the LeRobot export writes Discrete actions and 1-D Box or MultiDiscrete ones"
        )
    flag = {"dtype": "bool", **_SCALAR_FEATURE}
    return {
        **observation,
        "action": action_feature,
        "next.reward": {"dtype": "float32", **_SCALAR_FEATURE},
        "next.done": flag,
        "next.truncated": flag,
        **LEROBOT_INDEX_FEATURES,
    }


def _vector_feature(dtype: Any, size: int) -> dict[str, Any]:
    return {"dtype": np.dtype(dtype).name, "shape": [size], "names": None}


def _whole_episodes(shards: Iterator[dict[str, Columnar]]) -> Iterator[dict[str, np.ndarray]]:
    """Each episode's columns, whole (an episode may go on into the next shard): memory holds one
    shard and the episode it ends in."""
    names = ("obs", "action", "reward", "terminated", "truncated", "episode_id")
    held: dict[str, np.ndarray] | None = None
    for shard in shards:
        columns = {name: np.asarray(shard[name]) for name in names}
        if held is not None:
            columns = {name: np.concatenate([held[name], values]) for name, values in columns.items()}
        ids = columns["episode_id"]
        if not len(ids):
            continue
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        for start, stop in zip(starts[:-1].tolist(), starts[1:].tolist()):
            yield {name: values[start:stop] for name, values in columns.items()}
        held = {name: values[starts[-1] :] for name, values in columns.items()}
    if held is not None:
        yield held


@dataclass
class _Moments:
    """A feature's per-dimension count, mean, sum of squared deviations, min and max, merged
    exactly (Chan et al.), and the frames they came from (an image counts its pixels)."""

    frames: int
    count: int
    mean: np.ndarray
    m2: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, image: bool) -> _Moments:
        """Per dimension of a vector feature; per channel of an image, scaled to [0, 1] as LeRobot's are."""
        rows = values.reshape(-1, values.shape[-1]) / 255.0 if image else values.reshape(len(values), -1).astype(np.float64)
        mean = rows.mean(axis=0)
        return cls(len(values), len(rows), mean, ((rows - mean) ** 2).sum(axis=0), rows.min(axis=0), rows.max(axis=0))

    def merge(self, other: _Moments) -> _Moments:
        count = self.count + other.count
        delta = other.mean - self.mean
        return _Moments(
            self.frames + other.frames,
            count,
            self.mean + delta * other.count / count,
            self.m2 + other.m2 + delta**2 * self.count * other.count / count,
            np.minimum(self.low, other.low),
            np.maximum(self.high, other.high),
        )

    def stats(self, image: bool) -> dict[str, list]:
        """LeRobot's stats: (d,) per dimension, (channels, 1, 1) for an image, count as (1,)."""
        shape = (-1, 1, 1) if image else (-1,)
        values = {"min": self.low, "max": self.high, "mean": self.mean, "std": np.sqrt(self.m2 / self.count)}
        return {**{key: value.reshape(shape).tolist() for key, value in values.items()}, "count": [self.frames]}


class _LeRobotWriter:
    """Writes whole episodes to data/chunk-NNN/file-NNN.parquet (one row group each, a new file
    once `LEROBOT_FILE_BYTES` is reached, as LeRobot's writer does) and then meta/."""

    def __init__(self, root: Path, features: dict[str, dict[str, Any]], task: str, metadata: str) -> None:
        self.root, self.features, self.task, self.metadata = root, features, task, metadata
        self.images = {key for key, feature in features.items() if feature["dtype"] == "image"}
        self.writer: Any = None  # the open pq.ParquetWriter
        self.files = 0  # data files opened
        self.file_bytes = 0
        self.frames = 0
        self.episodes: list[dict[str, Any]] = []
        self.totals: dict[str, _Moments] = {}

    def add(self, episode: dict[str, np.ndarray]) -> None:
        """Write one episode's frames and keep its row of meta/episodes and its stats."""
        import pyarrow.parquet as pq

        count, number = len(episode["reward"]), len(self.episodes)
        frame = np.arange(count, dtype=np.int64)
        values = {
            next(iter(self.features)): episode["obs"],  # the observation's feature comes first
            "action": episode["action"],
            "next.reward": episode["reward"],
            "next.done": episode["terminated"],
            "next.truncated": episode["truncated"],
            "timestamp": (frame / LEROBOT_FPS).astype(np.float32),
            "frame_index": frame,
            "episode_index": np.full(count, number, np.int64),
            "index": self.frames + frame,
            "task_index": np.zeros(count, np.int64),
        }
        table = pa.table({key: self._arrow(key, values[key]) for key in self.features}).replace_schema_metadata(
            {METADATA_KEY: self.metadata}
        )
        if self.writer is not None and self.file_bytes + table.nbytes > LEROBOT_FILE_BYTES:
            self.writer.close()
            self.writer = None
        if self.writer is None:
            path = self.root / LEROBOT_DATA_PATH.format(**self._file_index(self.files))
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, table.schema)
            self.files += 1
            self.file_bytes = 0
        self.writer.write_table(table)
        self.file_bytes += table.nbytes
        stats = {key: _Moments.of(np.asarray(value), key in self.images) for key, value in values.items()}
        for key, moments in stats.items():
            self.totals[key] = self.totals[key].merge(moments) if key in self.totals else moments
        data_file = self._file_index(self.files - 1)
        self.episodes.append(
            {
                "episode_index": number,
                "tasks": [self.task],
                "length": count,
                "data/chunk_index": data_file["chunk_index"],
                "data/file_index": data_file["file_index"],
                "dataset_from_index": self.frames,
                "dataset_to_index": self.frames + count,
                **{
                    f"stats/{key}/{name}": value
                    for key, moments in stats.items()
                    for name, value in moments.stats(key in self.images).items()
                },
                "meta/episodes/chunk_index": 0,
                "meta/episodes/file_index": 0,
            }
        )
        self.frames += count

    def _arrow(self, key: str, values: np.ndarray) -> pa.Array:
        """A feature's column: PNG images, a scalar for shape (1,), else fixed-size lists."""
        if key in self.images:
            return _png_images(values)
        if self.features[key]["shape"] == [1]:
            return pa.array(values.reshape(len(values)))
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).reshape(-1)), values.shape[1])

    @staticmethod
    def _file_index(number: int) -> dict[str, int]:
        return {"chunk_index": number // LEROBOT_CHUNK_FILES, "file_index": number % LEROBOT_CHUNK_FILES}

    def finish(self) -> None:
        """Close the last data file and write meta/: episodes, tasks, stats.json and info.json."""
        import pyarrow.parquet as pq

        if self.writer is not None:
            self.writer.close()
        meta = self.root / "meta"
        (self.root / LEROBOT_EPISODES_PATH).parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), self.root / LEROBOT_EPISODES_PATH)
        tasks = pa.table({"task_index": pa.array([0], pa.int64()), "task": [self.task]})
        pq.write_table(tasks.replace_schema_metadata({"pandas": json.dumps(_TASKS_PANDAS_METADATA)}), meta / "tasks.parquet")
        stats = {key: moments.stats(key in self.images) for key, moments in self.totals.items()}
        (meta / "stats.json").write_text(json.dumps(stats, indent=4))
        info = {
            "codebase_version": LEROBOT_VERSION,
            "fps": LEROBOT_FPS,
            "features": self.features,
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": 1,
            "chunks_size": LEROBOT_CHUNK_FILES,
            "data_files_size_in_mb": max(1, LEROBOT_FILE_BYTES >> 20),
            "video_files_size_in_mb": 200,
            "data_path": LEROBOT_DATA_PATH,
            "video_path": None,
            "robot_type": None,
            "splits": {"train": f"0:{len(self.episodes)}"},
        }
        (self.root / LEROBOT_INFO_PATH).write_text(json.dumps(info, indent=4))


def _png_images(frames: np.ndarray) -> pa.Array:
    """uint8 frames as LeRobot's image column: a struct of PNG bytes and a file name."""
    from PIL import Image

    encoded = []
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    names = [f"frame-{i:06d}.png" for i in range(len(frames))]
    return pa.StructArray.from_arrays([pa.array(encoded, pa.binary()), pa.array(names, pa.string())], names=["bytes", "path"])
