"""Exporting a dataset to files other tools read: Parquet (one row per transition, loadable
with Hugging Face `datasets`), D4RL's HDF5 layout, and the same arrays in a NumPy .npz.
The reverse of `rlpipe.datasets.imports`; Minari's layout is `rlpipe.datasets.minari_io`'s.

The file is written from the verified shards one at a time (the loader's `ShardVerifier`:
every check loading runs), so memory holds one shard (at most the writer's 256 MiB, images
decoded) and one row group, whatever the dataset's size. It goes to a temporary file beside
the output, renamed over it once complete (`rlpipe.files.atomic_output`): a failure, a
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
Neither carries the info/next_info columns; multi-agent datasets are refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
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
from rlpipe.files import atomic_output, check_output_file

EXPORT_FORMATS = ("minari", "parquet", "d4rl", "npz")
FILE_FORMATS = EXPORT_FORMATS[1:]  # written to --out; minari goes to Minari's dataset root
METADATA_KEY = "rlpipe.metadata"  # the Parquet key-value metadata holding metadata.json
ROW_GROUP_BYTES = 64 << 20  # a row group's bytes, about (rows sized by the shards' bytes per row): readers hold one at a time

Append = Callable[[dict[str, Columnar]], None]  # takes a shard's columns


def export_file(info: DatasetInfo, out: str | os.PathLike, target: str, *, force: bool = False) -> int:
    """Write dataset `info` to the file `out` as `target` (parquet, d4rl or npz; the module
    doc says what each carries); returns the transitions written. An existing `out` is
    replaced only with `force` (a FIFO or a character device, e.g. /dev/stdout, is written
    through); each refusal is one RlpipeError raised before anything is written."""
    if target not in FILE_FORMATS:
        raise RlpipeError(f"unknown export target {target!r}: choose one of {', '.join(EXPORT_FORMATS)}")
    if info.metadata["multi_agent"]:
        raise RlpipeError(f"dataset {info.name!r} holds multi-agent rows: the file formats hold one agent's transitions")
    if target != "parquet" and isinstance(info.observation_space, gym.spaces.Dict):
        raise RlpipeError(f"dataset {info.name!r} has Dict observations: D4RL's layout holds arrays (export it --to parquet)")
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
            append({key: values.astype(np.float32, copy=False) if values.dtype.kind == "f" else values for key, values in arrays.items()})

        yield append_shard


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
