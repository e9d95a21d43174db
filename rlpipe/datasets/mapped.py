"""Datasets larger than memory: the columns training samples, left in their Arrow shards and
gathered row by row, never copied whole.

`load_shards` concatenates several shards into new arrays (twice the data in RAM while it
runs). :class:`MappedTransitions` keeps one read-only memory map per shard and gathers any
rows from it; boolean columns stay bit-packed (Arrow's layout) and are unpacked per gather.

Mapped pages that a gather touches count as the process's resident memory, and the page
cache hands them out in large folios (Linux 6.x: one random row maps up to megabytes), so
after a few random batches a mapped column is resident whole. Columns are therefore mapped,
smallest first, only while they fit in `resident_bytes`; the others are read with `pread`
per row (the kernel's page cache holds them, outside the process). In collected data
next_obs repeats the following row's obs, so it is gathered from obs (`FollowingRows`)
except at episode ends. Torch-free; the sampler
is `rlpipe.training.sampler.MappedSampler`.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rlpipe.datasets.loader import checked_shard_paths
from rlpipe.datasets.schema import Columnar, from_arrow, map_columnar, scalar_from_arrow
from rlpipe.datasets.store import DatasetInfo
from rlpipe.errors import RlpipeError

SAMPLED_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated")  # what off-policy updates read
# Mapped (resident) column bytes at most, leaving ~0.5 GiB of a 2 GiB process for torch and
# the rest; 50M CartPole rows: obs, action, reward, terminated mapped (1.4 GB), next_obs
# gathered from obs (`FollowingRows`).
DEFAULT_RESIDENT_BYTES = 3 << 29


@dataclass(frozen=True)
class PackedBits:
    """A bit-packed Arrow boolean column: bit `offset + i` of `data` is row i."""

    data: np.ndarray  # uint8, a view of the map
    offset: int

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        bit = rows + self.offset
        return ((self.data[bit >> 3] >> (bit & 7).astype(np.uint8)) & 1).astype(bool)


class PreadColumn:
    """A fixed-width numeric column of a shard read with one `pread` per requested row."""

    def __init__(self, fd: int, offset: int, view: np.ndarray) -> None:
        self.fd, self.offset = fd, offset
        self.dtype, self.row_shape, self.rows = view.dtype, view.shape[1:], len(view)
        self.row_bytes = view.dtype.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        pread, fd, width, offset = os.pread, self.fd, self.row_bytes, self.offset
        data = b"".join([pread(fd, width, offset + row * width) for row in rows.tolist()])
        return np.frombuffer(data, self.dtype).reshape((len(rows),) + self.row_shape)

    def read_all(self) -> np.ndarray:
        data = os.pread(self.fd, self.rows * self.row_bytes, self.offset)
        return np.frombuffer(data, self.dtype).reshape((self.rows,) + self.row_shape)


class FollowingRows:
    """`next_obs` of a shard whose rows chain (``next_obs[i] == obs[i + 1]`` inside an
    episode, as collected data does): gathered from the shard's obs column one row on,
    except at `breaks` (episode ends, where next_obs is the final observation), whose
    values are held in RAM. Halves the bytes a gather touches."""

    def __init__(self, shard: dict, breaks: np.ndarray, values: np.ndarray) -> None:
        self.shard, self.breaks, self.values = shard, breaks, values

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        out = self.shard["obs"][np.minimum(rows + 1, self.breaks[-1])]  # the last row is a break: its value comes below
        at = np.minimum(np.searchsorted(self.breaks, rows), len(self.breaks) - 1)
        hit = self.breaks[at] == rows
        if hit.any():
            out = out if out.flags.writeable else out.copy()
            out[hit] = self.values[at[hit]]
        return out


def _column(batch: pa.RecordBatch, name: str, space) -> Columnar | PackedBits:
    column = batch.column(name)
    if pa.types.is_boolean(column.type):
        if column.null_count:
            raise RlpipeError(f"column {name} has missing values")
        return PackedBits(np.frombuffer(column.buffers()[1], np.uint8), column.offset)
    return scalar_from_arrow(column) if space is None else from_arrow(column, space)  # zero-copy for numbers


class MappedTransitions:
    """The `columns` of a dataset's shards, memory-mapped; `take(rows)` gathers any rows.

    Rows are numbered through the shards in order, as `load_shards` concatenates them.
    """

    def __init__(self, info: DatasetInfo, columns: tuple[str, ...] = SAMPLED_COLUMNS, resident_bytes: int = DEFAULT_RESIDENT_BYTES) -> None:
        spaces = {"obs": info.observation_space, "next_obs": info.observation_space, "action": info.action_space}
        self._maps: list[mmap.mmap] = []
        self._files: list[int] = []
        self._shards: list[dict[str, Columnar | PackedBits]] = []
        sizes = []
        for path in checked_shard_paths(info):
            batch = self._map(path)
            self._shards.append({name: _column(batch, name, spaces.get(name)) for name in columns})
            sizes.append(batch.num_rows)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - np.asarray(sizes)
        if {"obs", "next_obs"} <= set(columns) and isinstance(self._shards[0]["obs"], np.ndarray):
            self._chain_next_obs()
        self.read_columns = self._read_beyond(resident_bytes)

    def _reader(self, index: int, leaf: np.ndarray) -> PreadColumn:
        """A `pread` reader of `leaf`, an array viewing shard `index`'s map."""
        base = np.frombuffer(self._maps[index], np.uint8).ctypes.data
        return PreadColumn(self._files[index], leaf.ctypes.data - base, leaf)

    def _chain_next_obs(self, chunk: int = 1 << 20) -> None:
        """Where a shard's next_obs follows its obs, replace next_obs by `FollowingRows`. The
        check reads both columns once with `pread` (bytes compared exactly), so it maps nothing."""
        for index, shard in enumerate(self._shards):
            obs, following = self._reader(index, shard["obs"]), self._reader(index, shard["next_obs"])
            breaks = []
            for first in range(0, obs.rows, chunk):
                last = min(first + chunk, obs.rows)
                rows = np.arange(first, last)
                later = obs[np.minimum(rows + 1, obs.rows - 1)].reshape(len(rows), -1).view(np.uint8)
                differ = (following[rows].reshape(len(rows), -1).view(np.uint8) != later).any(axis=1)
                breaks.append(rows[differ | (rows == obs.rows - 1)])
            breaks = np.concatenate(breaks)
            if len(breaks) > obs.rows // 2:  # not trajectories (e.g. relabelled transitions): keep the column
                continue
            shard["next_obs"] = FollowingRows(shard, breaks, following[breaks])

    def _read_beyond(self, resident_bytes: int) -> tuple[str, ...]:
        """Switch the largest columns to `pread` until the mapped ones fit in `resident_bytes`."""
        size = {name: sum(_nbytes(shard[name]) for shard in self._shards) for name in self.columns}
        mapped, read = 0, []
        for name in sorted(size, key=size.get):
            if mapped + size[name] <= resident_bytes or isinstance(self._shards[0][name], (PackedBits, FollowingRows)):
                mapped += size[name]
                continue
            read.append(name)
            for index, shard in enumerate(self._shards):
                shard[name] = map_columnar(shard[name], lambda a: self._reader(index, a))
        return tuple(read)

    def _map(self, path: Path) -> pa.RecordBatch:
        try:
            with open(path, "rb") as file:
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self._files.append(os.open(path, os.O_RDONLY))
            reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping)))
            if reader.num_record_batches != 1:
                raise RlpipeError(f"shard {path} holds {reader.num_record_batches} record batches; mapped reading needs one "
                                  "(rlpipe's writer makes one per shard)")
            self._maps.append(mapping)
            return reader.get_batch(0)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
            raise RlpipeError(f"corrupted shard {path}: {exc} (run `rlpipe datasets validate`)") from None

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._shards[0])

    def take(self, rows: np.ndarray) -> dict[str, Columnar]:
        """The values of every column at `rows` (int64 row numbers, any order, repeats allowed)."""
        rows = np.asarray(rows, np.int64)
        if len(self._shards) == 1:
            return {name: _gather(column, rows) for name, column in self._shards[0].items()}
        shard = np.searchsorted(self._ends, rows, side="right")
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self._shards) + 1))
        parts = {name: [] for name in self.columns}
        for index in np.flatnonzero(np.diff(bounds)):
            local = rows[order[bounds[index] : bounds[index + 1]]] - self._starts[index]
            for name, column in self._shards[index].items():
                parts[name].append(_gather(column, local))
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return {name: _reorder(chunks, inverse) for name, chunks in parts.items()}

    @property
    def obs(self) -> Columnar:
        """Every observation as one in-RAM array (a copy: observation statistics need them all)."""
        return self.column("obs")

    def column(self, name: str) -> Columnar:
        """A whole column as one in-RAM array (a copy, e.g. for observation statistics)."""
        return _reorder([map_columnar(shard[name], _whole) if not isinstance(shard[name], (PackedBits, FollowingRows))
                         else shard[name][np.arange(end - start)] for shard, start, end in zip(self._shards, self._starts, self._ends)], None)

    def close(self) -> None:
        """Close the `pread` file descriptors (the maps close with the arrays that view them)."""
        for fd in self._files:
            os.close(fd)
        self._files = []


def _whole(leaf: np.ndarray | PreadColumn) -> np.ndarray:
    return leaf.read_all() if isinstance(leaf, PreadColumn) else np.array(leaf)


def _nbytes(column: Columnar | PackedBits | FollowingRows) -> int:
    """Mapped bytes of a column (FollowingRows maps none of its own)."""
    if isinstance(column, FollowingRows):
        return 0
    if isinstance(column, PackedBits):
        return column.data.nbytes
    return sum(_nbytes(sub) for sub in column.values()) if isinstance(column, dict) else column.nbytes


def _gather(column: Columnar | PackedBits, rows: np.ndarray) -> Columnar:
    if isinstance(column, PackedBits):
        return column[rows]
    return map_columnar(column, lambda a: a[rows])


def _reorder(chunks: list[Columnar], inverse: np.ndarray | None) -> Columnar:
    """Concatenate per-shard chunks, then put the rows back in the requested order."""
    if isinstance(chunks[0], dict):
        return {key: _reorder([chunk[key] for chunk in chunks], inverse) for key in chunks[0]}
    joined = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return joined if inverse is None else joined[inverse]
