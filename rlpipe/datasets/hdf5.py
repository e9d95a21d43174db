"""Minari's HDF5 layout, written from our Arrow shards so `minari.load_dataset` reads it.

Layout (Minari 0.5): `data/main_data.hdf5` with one group `episode_{i}` per episode holding
`observations` (steps + 1 rows: the final observation is appended), `actions`, `rewards`,
`terminations`, `truncations` and an `infos` group; Dict spaces become sub-groups. Minari's
own `data/metadata.json` sits beside it. Timestamps are off so the bytes are reproducible.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import gymnasium as gym
import minari
import numpy as np
from minari.serialization import deserialize_space

from rlpipe.datasets.loader import read_shard
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.datasets.store import MINARI_DIR, MINARI_HDF5_FILE, MINARI_METADATA_FILE, DatasetInfo
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import loads_json

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

_HID = ctypes.c_int64  # hid_t (HDF5 >= 1.10)
_H5P_DEFAULT = _H5S_ALL = 0  # (hid_t)0 in H5Ppublic.h and H5Spublic.h


def default_minari_id(name: str) -> str:
    """The Minari id of dataset `name`: `rlpipe/<name>-v0` (or `rlpipe/<name>` when it already
    ends in `-v<N>`), with characters Minari ids refuse (`.`) turned into `_`.

    Minari parses every id as `(namespace/)name-v<N>`; an id without a version breaks
    `.spec`, `minari show` and `minari list local` for the whole root.
    """
    base = re.sub(r"[^-\w]", "_", name)
    return f"rlpipe/{base}" if re.search(r"-v\d+$", base) else f"rlpipe/{base}-v0"


def minari_metadata(name: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The fields of Minari's `data/metadata.json` for dataset `name`, from its rlpipe
    metadata (serialized spaces, `producer`, `env_spec` and any of MINARI_METADATA_KEYS)."""
    return {
        **{key: metadata[key] for key in MINARI_METADATA_KEYS if metadata.get(key) is not None},
        "algorithm_name": str(metadata["producer"].get("algorithm") or "rlpipe"),
        "dataset_id": default_minari_id(name),
        "observation_space": metadata["observation_space"],
        "action_space": metadata["action_space"],
        "env_spec": metadata.get("env_spec"),
    }


def check_minari_id(dataset_id: str) -> str:
    """Return `dataset_id` if Minari accepts it, with its version; else a one-line RlpipeError."""
    from minari.dataset.minari_dataset import DATASET_ID_RE

    match = DATASET_ID_RE.fullmatch(dataset_id)
    if match is None or match.group("version") is None:
        raise RlpipeError(
            f"invalid Minari dataset id {dataset_id!r}: Minari ids are (namespace/)name-v<N>, e.g. rlpipe/{dataset_id.rsplit('/', 1)[-1]}-v0"
        )
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
    return bool(np.array_equal(cast(np.ndarray, next_obs)[:-1][inner], obs[1:][inner]))  # shaped like obs


class _HDF5Calls:
    """Groups, datasets and scalar attributes through HDF5's C functions, called with ctypes on
    the library h5py has loaded (h5py opens and closes the file).

    Minari's layout is a group per episode with ~6 datasets and ~7 attributes, so the cost
    is per object, not per byte. Through h5py's low-level API, perf put only ~40% of the
    time in libhdf5 and most of the rest in h5py's wrappers (object registry, lock, argument
    conversion) and Python; direct calls make the same objects, byte for byte, in ~0.56x the
    time (1M random CartPole steps, 45k episodes: 280 -> 158 us per episode). Values are
    plain fixed-size numbers (`schema.leaf_dtype`), so each write is one buffer in the
    file's own type: no conversion.
    """

    _SIGNATURES = {  # name: (return type, argument types) from H5Gpublic.h, H5Apublic.h, ...
        "H5Gcreate2": (_HID, [_HID, ctypes.c_char_p, _HID, _HID, _HID]),
        "H5Gclose": (ctypes.c_int, [_HID]),
        "H5Acreate2": (_HID, [_HID, ctypes.c_char_p, _HID, _HID, _HID, _HID]),
        "H5Awrite": (ctypes.c_int, [_HID, _HID, ctypes.c_void_p]),
        "H5Aclose": (ctypes.c_int, [_HID]),
        "H5Dcreate2": (_HID, [_HID, ctypes.c_char_p, _HID, _HID, _HID, _HID, _HID]),
        "H5Dwrite": (ctypes.c_int, [_HID, _HID, _HID, _HID, _HID, ctypes.c_void_p]),
        "H5Dclose": (ctypes.c_int, [_HID]),
        "H5Screate_simple": (_HID, [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p]),
        "H5Sclose": (ctypes.c_int, [_HID]),
    }
    # the functions above, set on each instance by __init__
    H5Gcreate2: Callable[..., int]
    H5Gclose: Callable[..., int]
    H5Acreate2: Callable[..., int]
    H5Awrite: Callable[..., int]
    H5Aclose: Callable[..., int]
    H5Dcreate2: Callable[..., int]
    H5Dwrite: Callable[..., int]
    H5Dclose: Callable[..., int]
    H5Screate_simple: Callable[..., int]
    H5Sclose: Callable[..., int]

    def __init__(self) -> None:
        import h5py  # only writing HDF5 needs it (0.1-0.5 s of start-up)

        self._h5 = h5py
        library = ctypes.CDLL(h5py.h5f.__file__)  # dlsym also searches the libhdf5 this module links
        for name, (restype, argtypes) in self._SIGNATURES.items():
            function = getattr(library, name)
            function.restype, function.argtypes, function.errcheck = restype, argtypes, _check_hdf5
            setattr(self, name, function)
        self._dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        self._dcpl.set_obj_track_times(False)  # reproducible bytes
        self._scalar = h5py.h5s.create(h5py.h5s.SCALAR)
        self._types: dict[np.dtype, Any] = {}  # h5py TypeIDs, kept alive while their ids are used
        self._spaces: dict[tuple[int, ...], int] = {}  # one dataspace per shape, closed with the file

    @contextlib.contextmanager
    def create_file(self, path: Path) -> Iterator[int]:
        """A new (truncated) HDF5 file, open while the context lasts: its id for the calls below."""
        # h5py serialises every HDF5 call under its re-entrant lock (libhdf5 is not thread-safe)
        with self._h5._objects.phil, self._h5.File(path, "w") as file:
            try:
                yield file.id.id
            finally:
                for space in self._spaces.values():
                    self.H5Sclose(space)
                self._spaces.clear()

    def type_id(self, dtype: np.dtype) -> int:
        """The HDF5 type h5py stores `dtype` as (bool: h5py's FALSE/TRUE enum)."""
        if dtype not in self._types:
            self._types[dtype] = self._h5.h5t.py_create(dtype, logical=True)
        return self._types[dtype].id

    def group(self, parent: int, name: bytes) -> int:
        """A new group; the caller closes it with close_group."""
        return self.H5Gcreate2(parent, name, _H5P_DEFAULT, _H5P_DEFAULT, _H5P_DEFAULT)

    def close_group(self, group: int) -> None:
        self.H5Gclose(group)

    def dataset(self, parent: int, name: bytes, type_id: int, shape: tuple[int, ...], data: int) -> None:
        """Dataset `name` of `shape`, filled from the C-contiguous buffer at address `data`."""
        if shape not in self._spaces:
            self._spaces[shape] = self.H5Screate_simple(len(shape), (ctypes.c_uint64 * len(shape))(*shape), None)
        dataset = self.H5Dcreate2(parent, name, type_id, self._spaces[shape], _H5P_DEFAULT, self._dcpl.id, _H5P_DEFAULT)
        try:
            self.H5Dwrite(dataset, type_id, _H5S_ALL, _H5S_ALL, _H5P_DEFAULT, data)
        finally:
            self.H5Dclose(dataset)

    def attribute(self, parent: int, name: bytes, type_id: int, data: int) -> None:
        """Scalar attribute `name`, its value read from address `data`."""
        attribute = self.H5Acreate2(parent, name, type_id, self._scalar.id, _H5P_DEFAULT, _H5P_DEFAULT)
        try:
            self.H5Awrite(attribute, type_id, data)
        finally:
            self.H5Aclose(attribute)


def _check_hdf5(result: int, function: Any, arguments: tuple) -> int:
    """ctypes errcheck: HDF5 functions return a negative value on failure."""
    if result < 0:
        raise RlpipeError(f"writing Minari's HDF5 layout failed in HDF5's {function.__name__}")
    return result


class _Leaf(NamedTuple):
    """One column's rows as a C buffer: row i starts at address + i * row_bytes."""

    type_id: int
    values: np.ndarray  # keeps the buffer at `address` alive
    address: int
    row_shape: tuple[int, ...]
    row_bytes: int


def _leaves(calls: _HDF5Calls, values: Columnar) -> Any:
    """`values` as a _Leaf, or for Dict columns a dict of them with byte-string keys."""
    if isinstance(values, dict):
        return {key.encode(): _leaves(calls, child) for key, child in values.items()}
    values = np.ascontiguousarray(values)
    row_shape = values.shape[1:]
    return _Leaf(
        calls.type_id(values.dtype), values, values.ctypes.data, row_shape, values.itemsize * int(np.prod(row_shape, dtype=np.int64))
    )


def _write_rows(calls: _HDF5Calls, parent: int, name: bytes, leaves: Any, first_row: int, rows: int) -> None:
    """Rows first_row .. first_row + rows - 1 of `leaves` as dataset `name` (Dicts as sub-groups)."""
    if isinstance(leaves, dict):
        group = calls.group(parent, name)
        try:
            for key, child in leaves.items():
                _write_rows(calls, group, key, child, first_row, rows)
        finally:
            calls.close_group(group)
        return
    calls.dataset(parent, name, leaves.type_id, (rows,) + leaves.row_shape, leaves.address + first_row * leaves.row_bytes)


def _fits_64_bits(seed: int | None) -> bool:
    """Whether an episode seed has an HDF5 attribute form: int64, or uint64 (Minari's
    DataCollector draws 64-bit seeds when an episode is reset without one)."""
    return isinstance(seed, int) and -(2**63) <= seed < 2**64


def _episode_statistics(rewards: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Per episode, what Minari's default `EpisodeMetadataCallback` records on every episode group.

    Episodes of equal length are reduced together, row by row: numpy sums each row as it
    sums a 1-D array (pairwise), so the values equal per-episode `np.sum`/`mean`/`std` bit
    for bit (`np.add.reduceat` sums sequentially and would not).
    """
    rewards = rewards.astype(np.float64)
    statistics = {f"rewards_{name}": np.empty(len(starts)) for name in ("sum", "mean", "std", "max", "min")}
    for length in np.unique(lengths):
        which = np.flatnonzero(lengths == length)
        block = rewards[starts[which, None] + np.arange(length)]
        for name, reduce in (("sum", np.sum), ("mean", np.mean), ("std", np.std), ("max", np.max), ("min", np.min)):
            statistics[f"rewards_{name}"][which] = reduce(block, axis=1)
    return statistics


def write_minari_layout(
    dataset_dir: Path,
    shard_paths: list[Path],
    minari_metadata: dict[str, Any],
    info_space: gym.spaces.Dict | None = None,
    episode_seeds: dict[str, int] | None = None,
) -> list[str]:
    """Write `data/main_data.hdf5` and Minari's `data/metadata.json` under `dataset_dir` from
    the Arrow shards at `shard_paths`, one shard at a time.

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
    calls = _HDF5Calls()
    with calls.create_file(data_dir / MINARI_HDF5_FILE) as file_id:
        for shard in shard_paths:
            rows = read_shard(shard, obs_space, act_space, info_space)
            episode_id, count = cast(np.ndarray, rows["episode_id"]), len(rows["reward"])  # a scalar column: one array
            starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
            if episode_id[0] != total_episodes or not np.array_equal(episode_id[starts], np.arange(len(starts)) + total_episodes):
                raise RlpipeError("Minari's HDF5 layout needs episode ids 0, 1, 2, ... in order: use --format arrow")
            chained = _chained(rows["obs"], rows["next_obs"], starts, count)
            if not chained or (info_space is not None and not _chained(rows["info"], rows["next_info"], starts, count)):
                raise RlpipeError(
                    "Minari's HDF5 layout stores trajectories, but next_obs differs from the next row's obs within an episode: use --format arrow"
                )
            infos = {} if info_space is None else _with_final_observations(rows["info"], rows["next_info"], starts, count)
            columns = [  # (name, leaves, whether an episode's rows end with its final observation)
                (b"observations", _leaves(calls, _with_final_observations(rows["obs"], rows["next_obs"], starts, count)), True),
                (b"actions", _leaves(calls, rows["action"]), False),
                (b"rewards", _leaves(calls, rows["reward"]), False),
                (b"terminations", _leaves(calls, rows["terminated"]), False),
                (b"truncations", _leaves(calls, rows["truncated"]), False),
                (b"infos", _leaves(calls, infos), True),
            ]
            lengths = np.diff(np.r_[starts, count])
            numbers = np.arange(len(starts), dtype=np.int64) + total_episodes
            attributes = {
                "id": numbers,
                "total_steps": lengths.astype(np.int64),
                **_episode_statistics(cast(np.ndarray, rows["reward"]), starts, lengths),
            }
            seed_values = [seeds.get(str(number)) for number in numbers.tolist()]
            has_seed = np.array([_fits_64_bits(seed) for seed in seed_values], dtype=bool)
            if has_seed.any():  # two's complement: the same 8 bytes read as int64, or as uint64 for seeds from 2**63
                # `fits`: the seed is an int (_fits_64_bits)
                attributes["seed"] = np.array(
                    [cast(int, seed) % 2**64 if fits else 0 for seed, fits in zip(seed_values, has_seed)], dtype=np.uint64
                )
                signed_seed = np.array([fits and cast(int, seed) < 2**63 for seed, fits in zip(seed_values, has_seed)], dtype=bool)
                int64_type = calls.type_id(np.dtype(np.int64))
            # Minari reads attributes by name; a fixed order keeps the bytes fixed
            attribute_leaves = [(key.encode(), _leaves(calls, attributes[key]), key == "seed") for key in sorted(attributes)]
            for index, (begin, steps) in enumerate(zip(starts.tolist(), lengths.tolist())):
                group = calls.group(file_id, f"episode_{total_episodes + index}".encode())
                try:
                    for name, leaf, is_seed in attribute_leaves:
                        if is_seed and not has_seed[index]:
                            continue
                        # seeds as h5py stores Minari's: int64, or uint64 when they do not fit it
                        type_id = int64_type if is_seed and signed_seed[index] else leaf.type_id
                        calls.attribute(group, name, type_id, leaf.address + index * leaf.row_bytes)
                    for name, leaves, with_final in columns:
                        _write_rows(calls, group, name, leaves, begin + index if with_final else begin, steps + with_final)
                finally:
                    calls.close_group(group)
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


def hdf5_problems(info: DatasetInfo, info_space: gym.spaces.Dict | None) -> list[str]:
    """Where the Minari copy under `data/` differs from the Arrow shards (the first difference):
    Minari's metadata.json (standard JSON; counts and spaces), and in main_data.hdf5 exactly
    the groups `episode_0 ..`, each with the shapes, dtypes and values `write_minari_layout`
    writes from the shards and the attributes `id` and `total_steps`. Reads everything once."""
    import h5py

    problem = _minari_metadata_problem(info)
    if problem:
        return [f"{MINARI_METADATA_FILE}: {problem}"]
    try:
        file = h5py.File(info.path / MINARI_DIR / MINARI_HDF5_FILE, "r")
    except (OSError, ValueError) as exc:
        return [f"{MINARI_DIR}/{MINARI_HDF5_FILE} is not a readable HDF5 file ({exc})"]
    with file:
        try:
            problem = _episodes_problem(file.id, info, info_space)
        except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:  # h5py's errors for damaged structures
            problem = f"damaged ({type(exc).__name__}: {exc})"
    return [f"{MINARI_DIR}/{MINARI_HDF5_FILE}: {problem}"] if problem else []


def _minari_metadata_problem(info: DatasetInfo) -> str | None:
    try:
        minari_metadata = loads_json((info.path / MINARI_METADATA_FILE).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        return f"unreadable ({exc})"
    if not isinstance(minari_metadata, dict):
        return "not a JSON object"
    for key in ("total_episodes", "total_steps", "observation_space", "action_space"):
        if minari_metadata.get(key) != info.metadata[key]:
            return f"{key} is {minari_metadata.get(key)!r}, the dataset's metadata says {info.metadata[key]!r}"
    return None


def _episodes_problem(file_id: Any, info: DatasetInfo, info_space: gym.spaces.Dict | None) -> str | None:
    """The first episode group that differs from the rows `write_minari_layout` would write
    (read with h5py's low-level API: half the cost per object of its high-level one)."""
    import h5py

    if file_id.get_num_objs() != info.metadata["total_episodes"]:
        return f"holds {file_id.get_num_objs()} objects, the dataset has {info.metadata['total_episodes']} episodes"
    for rel in info.shard_rels:
        rows = read_shard(info.path / rel, info.observation_space, info.action_space, info_space)
        episode_id, count = cast(np.ndarray, rows["episode_id"]), len(rows["reward"])  # a scalar column: one array
        starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
        columns = {
            b"observations": (_with_final_observations(rows["obs"], rows["next_obs"], starts, count), True),
            b"actions": (rows["action"], False),
            b"rewards": (rows["reward"], False),
            b"terminations": (rows["terminated"], False),
            b"truncations": (rows["truncated"], False),
            b"infos": ({} if info_space is None else _with_final_observations(rows["info"], rows["next_info"], starts, count), True),
        }
        for index, (begin, steps) in enumerate(zip(starts.tolist(), np.diff(np.r_[starts, count]).tolist())):
            number = int(episode_id[begin])
            name = f"episode_{number}"
            try:
                group = h5py.h5g.open(file_id, name.encode())
            except (KeyError, ValueError):
                return f"{name} is missing"
            for attribute, expected in ((b"id", number), (b"total_steps", steps)):
                found = _scalar_attribute(group, attribute)
                if found != expected:
                    return f"{name} has {attribute.decode()} {found}, the Arrow data gives {expected}"
            for column, (values, with_final) in columns.items():
                first = begin + index if with_final else begin
                expected_rows = map_columnar(values, lambda a: a[first : first + steps + with_final])
                problem = _leaf_difference(group, column, expected_rows, f"{name}/{column.decode()}")
                if problem:
                    return problem
    return None


def _scalar_attribute(group: Any, name: bytes) -> int | None:
    import h5py

    try:
        attribute = h5py.h5a.open(group, name)
        value = np.empty((), attribute.dtype)
        attribute.read(value)
        return int(value)
    except (KeyError, ValueError, TypeError):
        return None


def _leaf_difference(group: Any, name: bytes, expected: Columnar, path: str) -> str | None:
    """How dataset (or, for Dict values, group) `name` differs from `expected`, or None."""
    import h5py

    if isinstance(expected, dict):
        try:
            sub = h5py.h5g.open(group, name)
        except (KeyError, ValueError):
            return f"{path} is missing or not a group"
        if sub.get_num_objs() != len(expected):
            return f"{path} holds {sub.get_num_objs()} objects, the Arrow data {len(expected)}"
        return next(filter(None, (_leaf_difference(sub, key.encode(), value, f"{path}/{key}") for key, value in expected.items())), None)
    try:
        dataset = h5py.h5d.open(group, name)
    except (KeyError, ValueError):
        return f"{path} is missing or not a dataset"
    if dataset.shape != expected.shape or dataset.dtype != expected.dtype:
        return f"{path} is {dataset.dtype}{list(dataset.shape)}, the Arrow data gives {expected.dtype}{list(expected.shape)}"
    found = np.empty(expected.shape, expected.dtype)
    dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, found)
    if found.tobytes() != np.ascontiguousarray(expected).tobytes():
        return f"{path} differs from the Arrow data"
    return None
