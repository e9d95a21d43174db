"""Datasets larger than memory: the columns training samples, left in their memory-mapped
Arrow shards and gathered row by row, never copied whole.

`load_shards` concatenates several shards into new arrays (twice the data in RAM while it
runs). :class:`MappedTransitions` keeps one read-only map per shard and gathers any rows
from them; boolean columns stay bit-packed (Arrow's layout) and are unpacked per gather.
Pages a gather touches stay mapped (they count as the process's resident memory) until
:meth:`MappedTransitions.release` hands them back to the page cache, so a sampler that
releases every few hundred batches keeps its resident memory bounded. Torch-free; the
sampler is `rlpipe.training.sampler.MappedSampler`.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rlpipe.datasets.loader import checked_shard_paths
from rlpipe.datasets.schema import Columnar, from_arrow, map_columnar, scalar_from_arrow
from rlpipe.datasets.store import DatasetInfo
from rlpipe.errors import RlpipeError

SAMPLED_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated")  # what off-policy updates read


@dataclass(frozen=True)
class PackedBits:
    """A bit-packed Arrow boolean column: bit `offset + i` of `data` is row i."""

    data: np.ndarray  # uint8, a view of the map
    offset: int

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        bit = rows + self.offset
        return ((self.data[bit >> 3] >> (bit & 7).astype(np.uint8)) & 1).astype(bool)


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

    def __init__(self, info: DatasetInfo, columns: tuple[str, ...] = SAMPLED_COLUMNS) -> None:
        spaces = {"obs": info.observation_space, "next_obs": info.observation_space, "action": info.action_space}
        self._maps: list[mmap.mmap] = []
        self._shards: list[dict[str, Columnar | PackedBits]] = []
        sizes = []
        for path in checked_shard_paths(info):
            batch = self._map(path)
            self._shards.append({name: _column(batch, name, spaces.get(name)) for name in columns})
            sizes.append(batch.num_rows)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - np.asarray(sizes)

    def _map(self, path: Path) -> pa.RecordBatch:
        try:
            with open(path, "rb") as file:
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
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
        whole = [_gather(shard[name], np.arange(end - start)) for shard, start, end in zip(self._shards, self._starts, self._ends)]
        return _reorder(whole, None)

    def release(self) -> None:
        """Unmap the pages gathers have touched (they stay in the page cache): resident memory drops."""
        for mapping in self._maps:
            mapping.madvise(mmap.MADV_DONTNEED)


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
