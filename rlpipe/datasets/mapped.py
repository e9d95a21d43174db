"""Datasets larger than memory: the columns training samples, gathered row by row from a
dataset's Arrow shards, without loading the dataset.

`load_shards` concatenates several shards into new arrays (twice the data in RAM while it
runs, and next_obs stored beside obs). :class:`MappedTransitions` opens each shard once
(a read-only memory map, used for the layout: where each column's bytes are) and
- holds the smallest columns in RAM, read once with `pread`, while they fit in
  `resident_bytes`: one contiguous array per column, so a gather is one numpy call;
- reads the other columns per row with `pread` (the kernel's page cache holds them,
  outside the process);
- gathers next_obs from obs one row on where the rows chain (collected data:
  next_obs[i] == obs[i + 1] inside an episode), keeping only the episode ends' next_obs;
- decodes compressed image columns (`rlpipe.datasets.codec`) per gathered frame, their
  block offsets held in RAM (8 bytes a row): decoded whole while that fits, else their
  compressed blocks held in RAM while those fit (a million Atari frames: ~420 MB), else one
  `pread` per frame; their next_obs is null where it chains, so the rows stored (episode
  ends) come from the null bitmap and are read from the file when gathered.
Mapping the columns instead keeps them out of the process only in name: pages a gather
touches become resident, in large folios on Linux 6.x (one random row maps up to
megabytes), so after a few random batches a mapped column is resident whole, and gathers
from several shards cost one numpy call per shard and column (2.8x the in-RAM sampler's
time at 50M rows). Torch-free; the sampler is `rlpipe.training.sampler.MappedSampler`.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.codec import block_bounds, decode_block, is_frame_column
from rlpipe.datasets.frames import chain_starts, stack_depths
from rlpipe.datasets.loader import verified_shard_paths
from rlpipe.datasets.schema import Columnar, from_arrow, map_columnar, scalar_from_arrow
from rlpipe.datasets.store import DatasetInfo
from rlpipe.errors import RlpipeError

SAMPLED_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated")  # what off-policy updates read
# Column bytes held in RAM at most, leaving ~0.5 GiB of a 2 GiB process for torch and the
# rest; 50M CartPole rows: obs, action, reward, terminated (1.5 GB) in RAM, next_obs from obs.
DEFAULT_RESIDENT_BYTES = 3 << 29


@dataclass(frozen=True)
class PackedBits:
    """A bit-packed Arrow boolean column: bits `offset + i * width ..` of `data` are row i's
    `shape` values (width = their count; a scalar column has shape ()), e.g. MinAtar's frames."""

    data: np.ndarray  # uint8, a view of the map
    offset: int
    rows: int
    shape: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        bit = rows + self.offset if self.shape == () else (rows * self.width + self.offset)[:, None] + np.arange(self.width)
        values = ((self.data[bit >> 3] >> (bit & 7).astype(np.uint8)) & 1).astype(bool)
        return values.reshape((len(rows),) + self.shape)

    def read_all(self) -> np.ndarray:
        bits = np.unpackbits(self.data, bitorder="little")[self.offset : self.offset + self.rows * self.width]
        return bits.astype(bool).reshape((self.rows,) + self.shape)


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

    def read(self, first: int, last: int) -> np.ndarray:
        """Rows first..last-1 in one read."""
        data = os.pread(self.fd, (last - first) * self.row_bytes, self.offset + first * self.row_bytes)
        return np.frombuffer(data, self.dtype).reshape((last - first,) + self.row_shape)

    def read_all(self) -> np.ndarray:
        return self.read(0, self.rows)

    def read_into(self, out: np.ndarray) -> None:
        """Every row into `out` (contiguous, this column's shape), without an intermediate copy."""
        view, done = memoryview(out).cast("B"), 0  # type: ignore[arg-type]  # numpy's stubs omit ndarray's buffer protocol
        while done < len(view):  # Linux reads at most ~2 GiB per call
            read = os.preadv(self.fd, [view[done : done + (1 << 30)]], self.offset + done)
            if read <= 0:
                raise RlpipeError("a dataset shard ended early (truncated?)")
            done += read


class FrameColumn:
    """A compressed image column of a shard: row i's block is bytes `bounds[i]..bounds[i + 1]`
    from `offset` in the file, read with one `pread` (or sliced from the blocks `hold` keeps
    in RAM) and decoded per requested row."""

    def __init__(self, fd: int, offset: int, bounds: np.ndarray, row_shape: tuple[int, ...], stored: np.ndarray) -> None:
        self.fd, self.offset, self.bounds = fd, offset, bounds
        self.dtype, self.row_shape, self.rows = np.dtype(np.uint8), row_shape, len(bounds) - 1
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64))
        self.stored = stored  # the rows that are not null
        self.blocks: memoryview | None = None

    @property
    def block_bytes(self) -> int:
        """The compressed size of the column."""
        return int(self.bounds[-1] - self.bounds[0]) if self.rows else 0

    def hold(self) -> None:
        """Keep the compressed blocks in RAM (one read): gathers then decode without a `pread`
        each (a system call costs several times an 84 x 84 frame's decode)."""
        data = os.pread(self.fd, self.block_bytes, self.offset + int(self.bounds[0]))
        if len(data) != self.block_bytes:
            raise RlpipeError("a dataset shard ended early (truncated?)")
        self.blocks = memoryview(data)

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.row_bytes), self.dtype)
        starts, ends = self.bounds[rows].tolist(), self.bounds[rows + 1].tolist()
        if self.blocks is None:
            pread, fd, offset = os.pread, self.fd, self.offset
            blocks: list[bytes | memoryview] = [pread(fd, end - start, offset + start) for start, end in zip(starts, ends)]
        else:
            held, base = self.blocks, int(self.bounds[0])
            blocks = [held[start - base : end - base] for start, end in zip(starts, ends)]
        for at, block in enumerate(blocks):
            self._decode(block, out[at], rows, at)
        return out.reshape((len(rows),) + self.row_shape)

    def read(self, first: int, last: int) -> np.ndarray:
        """Rows first..last-1, their blocks in one read."""
        out = np.empty((last - first,) + self.row_shape, self.dtype)
        self.read_into(out, first)
        return out

    def read_all(self) -> np.ndarray:
        return self.read(0, self.rows)

    def read_into(self, out: np.ndarray, first: int = 0) -> None:
        """Rows first.. into `out` (contiguous, this column's shape)."""
        bounds = (self.bounds[first : first + len(out) + 1] - self.bounds[first]).tolist()
        blocks = memoryview(os.pread(self.fd, bounds[-1], self.offset + int(self.bounds[first])))
        frames, rows = out.reshape(len(out), -1), np.arange(first, first + len(out))
        for at in range(len(out)):
            self._decode(blocks[bounds[at] : bounds[at + 1]], frames[at], rows, at)

    @staticmethod
    def _decode(block: bytes | memoryview, out: np.ndarray, rows: np.ndarray, at: int) -> None:
        """Decode `block` (that of shard row `rows[at]`) into `out`."""
        try:
            decode_block(block, out)
        except ValueError as exc:
            raise RlpipeError(
                f"a dataset frame at shard row {int(rows[at])} does not decode ({exc}); run `rlpipe datasets validate`"
            ) from None


class FollowingRows:
    """next_obs where rows chain: obs one row on, except at `breaks` (sorted global rows:
    episode ends, whose next_obs is the final observation), whose values are held here (or
    gathered by `values[positions in breaks]`, e.g. from compressed frames)."""

    def __init__(self, breaks: np.ndarray, values: np.ndarray | _StoredFrames) -> None:
        self.breaks, self.values = breaks, values

    def take(self, rows: np.ndarray, obs_at: Callable[[np.ndarray], Any]) -> np.ndarray:
        """next_obs at `rows`, with `obs_at(rows)` gathering obs."""
        out = obs_at(np.minimum(rows + 1, self.breaks[-1]))  # the last row is a break: its value comes below
        at = np.minimum(np.searchsorted(self.breaks, rows), len(self.breaks) - 1)
        hit = self.breaks[at] == rows
        if hit.any():
            out = out if out.flags.writeable else out.copy()
            out[hit] = self.values[at[hit]]
        return out


def _column(batch: pa.RecordBatch, name: str, space: gym.Space | None) -> Columnar | PackedBits | pa.Array:
    column = batch.column(name)
    if is_frame_column(column):
        return column  # a `FrameColumn` once the shard's file is open
    if pa.types.is_boolean(column.type):  # without nulls: `verified_shard_paths` checked
        return PackedBits(np.frombuffer(column.buffers()[1], np.uint8), column.offset, len(column))
    if isinstance(space, gym.spaces.Box) and pa.types.is_fixed_size_list(column.type) and pa.types.is_boolean(column.type.value_type):
        # a bool Box (MinAtar frames)
        values = column.flatten()
        return PackedBits(np.frombuffer(values.buffers()[1], np.uint8), values.offset, len(column), tuple(space.shape))
    return scalar_from_arrow(column) if space is None else from_arrow(column, space)  # zero-copy views of the map


class MappedTransitions:
    """The `columns` of a dataset's shards; `take(rows)` gathers any rows (see the module).

    Rows are numbered through the shards in order, as `load_shards` concatenates them.
    `resident` names the columns held in RAM, `read_columns` those read per row.
    """

    def __init__(self, info: DatasetInfo, columns: tuple[str, ...] = SAMPLED_COLUMNS, resident_bytes: int = DEFAULT_RESIDENT_BYTES) -> None:
        spaces = {"obs": info.observation_space, "next_obs": info.observation_space, "action": info.action_space}
        self.columns = columns
        self.multi_agent = bool(info.metadata.get("multi_agent", False))  # agents' rows interleave: no chains of steps
        self._maps: list[mmap.mmap] = []
        self._files: list[int] = []
        # each column of each shard: a PackedBits, a FrameColumn, or a PreadColumn (or a dict of them, for Dict spaces)
        self._shards: list[dict[str, Any]] = []
        sizes = []
        for path in verified_shard_paths(info):  # every check load_shards runs, one shard in memory at a time
            batch = self._map(path)
            self._shards.append({name: _column(batch, name, spaces.get(name)) for name in columns})
            sizes.append(batch.num_rows)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - np.asarray(sizes)
        for index, shard in enumerate(self._shards):  # from here on the maps are never read: pread only
            for name in columns:
                if isinstance(shard[name], pa.Array):
                    shard[name] = self._frames(index, shard[name], cast(gym.spaces.Box, spaces[name]))  # frames: an image Box
                elif not isinstance(shard[name], PackedBits):
                    shard[name] = map_columnar(shard[name], lambda a: self._reader(index, a))
        if "next_obs" in columns and "obs" not in columns and isinstance(self._shards[0]["next_obs"], FrameColumn):
            raise RlpipeError("this dataset's next_obs are compressed and null where they are the next obs: read obs with them")
        self._following = self._chain_next_obs() if {"obs", "next_obs"} <= set(columns) else None
        self._resident: dict[str, Columnar] = {}
        self._hold_in_ram(resident_bytes)
        self.read_columns = tuple(
            name for name in columns if name not in self._resident and not (name == "next_obs" and self._following is not None)
        )

    def _reader(self, index: int, leaf: np.ndarray) -> PreadColumn:
        """A `pread` reader of `leaf`, an array viewing shard `index`'s map."""
        base = np.frombuffer(self._maps[index], np.uint8).ctypes.data
        if not base <= leaf.ctypes.data <= base + len(self._maps[index]) - leaf.nbytes:
            raise RlpipeError("a column of this dataset cannot be read from its memory maps (a boolean inside a Dict?); load it instead")
        return PreadColumn(self._files[index], leaf.ctypes.data - base, leaf)

    def _frames(self, index: int, column: pa.Array, space: gym.spaces.Box) -> FrameColumn:
        """A `pread` reader of `column`, compressed frames in shard `index`'s map."""
        mapping = np.frombuffer(self._maps[index], np.uint8)
        bounds = np.array(block_bounds(column))  # in RAM: the map is not touched again
        values = column.buffers()[2]
        offset = (values.address if values is not None else mapping.ctypes.data) - mapping.ctypes.data
        if len(bounds) and (bounds[0] < 0 or np.any(np.diff(bounds) < 0) or not 0 <= offset + bounds[-1] <= len(mapping)):
            raise RlpipeError("a compressed column of this dataset does not lie in its shard; run `rlpipe datasets validate`")
        stored = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
        return FrameColumn(self._files[index], offset, bounds, tuple(space.shape), stored)

    def stack_depths(self, frame_stack: int) -> np.ndarray:
        """Each row's frame-stack depth (`rlpipe.datasets.frames.stack_depths`)."""
        if self.multi_agent or ("obs" in self.columns and isinstance(self._shards[0]["obs"], dict)):
            raise RlpipeError("frame stacks are defined for single-agent datasets of array observations only")
        return stack_depths(self.chains()[0], frame_stack)

    def chains(self) -> tuple[np.ndarray, np.ndarray]:
        """Whether each row starts a chain (`rlpipe.datasets.frames.chain_starts`) and each
        row's episode step (int32), from the shards' episode_id and step columns (read once,
        not kept)."""
        starts, steps, previous = [], [], None
        for index, mapping in enumerate(self._maps):
            batch = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping))).get_batch(0)
            episode_id, step = (self._reader(index, scalar_from_arrow(batch.column(name))).read_all() for name in ("episode_id", "step"))
            starts.append(chain_starts(episode_id, step, previous))
            steps.append(step.astype(np.int32))
            if len(step):
                previous = (int(episode_id[-1]), int(step[-1]))
        return np.concatenate(starts), np.concatenate(steps)

    def _chain_next_obs(self, chunk: int = 1 << 20) -> FollowingRows | None:
        """`FollowingRows` when next_obs follows obs in every shard (bytes compared exactly,
        reading each column once; compressed frames: where next_obs is null); None otherwise
        (e.g. relabelled transitions)."""
        breaks: np.ndarray | list[np.ndarray]
        if isinstance(self._shards[0]["next_obs"], FrameColumn):
            breaks = np.concatenate([shard["next_obs"].stored + start for shard, start in zip(self._shards, self._starts)])
            return FollowingRows(breaks, _StoredFrames(self, breaks))
        if not all(isinstance(shard["obs"], PreadColumn) for shard in self._shards):
            return None  # Dict observations: next_obs is read as it is
        breaks, values = [], []
        for shard, start in zip(self._shards, self._starts):
            obs, following = shard["obs"], shard["next_obs"]
            for first in range(0, obs.rows, chunk):
                last = min(first + chunk, obs.rows)
                nexts = following.read(first, last)
                later = obs.read(first + 1, min(last + 1, obs.rows))  # one row short at the shard's end
                differ = np.ones(last - first, bool)  # the shard's last row is always a break
                differ[: len(later)] = (
                    nexts[: len(later)].reshape(len(later), -1).view(np.uint8) != later.reshape(len(later), -1).view(np.uint8)
                ).any(axis=1)
                ends = np.flatnonzero(differ)
                breaks.append(ends + first + start)
                values.append(nexts[ends])
            if sum(map(len, breaks)) > (start + obs.rows) // 2:  # not trajectories
                return None
        return FollowingRows(np.concatenate(breaks), np.concatenate(values))

    def _hold_in_ram(self, resident_bytes: int) -> None:
        """Read the smallest columns into RAM while they fit in `resident_bytes`; then keep the
        compressed blocks of frame columns too large decoded, while they fit."""
        needed = [name for name in self.columns if not (name == "next_obs" and self._following is not None)]
        size = {name: sum(_nbytes(shard[name]) for shard in self._shards) for name in needed}
        held = 0
        for name in sorted(needed, key=size.get):  # type: ignore[arg-type]  # every name is in size
            if held + size[name] > resident_bytes:
                break
            self._resident[name] = self.column(name)
            held += size[name]
        for name in needed:
            frames = [shard[name] for shard in self._shards if isinstance(shard[name], FrameColumn)]
            blocks = sum(column.block_bytes for column in frames)
            if name not in self._resident and frames and held + blocks <= resident_bytes:
                for column in frames:
                    column.hold()
                held += blocks

    def _map(self, path: Path) -> pa.RecordBatch:
        try:
            with open(path, "rb") as file:
                mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self._files.append(os.open(path, os.O_RDONLY))
            reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping)))
            if reader.num_record_batches != 1:
                raise RlpipeError(
                    f"shard {path} holds {reader.num_record_batches} record batches; mapped reading needs one "
                    "(rlpipe's writer makes one per shard)"
                )
            self._maps.append(mapping)
            return reader.get_batch(0)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
            raise RlpipeError(f"corrupted shard {path}: {exc} (run `rlpipe datasets validate`)") from None

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(self._resident)

    def take(self, rows: np.ndarray, columns: tuple[str, ...] | None = None) -> dict[str, Columnar]:
        """The values of every column (or of `columns`) at `rows` (int64 row numbers, any
        order, repeats allowed)."""
        rows = np.asarray(rows, np.int64)
        return {name: self._take(name, rows) for name in columns or self.columns}

    def _take(self, name: str, rows: np.ndarray) -> Columnar:
        if name in self._resident:
            return map_columnar(self._resident[name], lambda a: a[rows])
        if name == "next_obs" and self._following is not None:
            return self._following.take(rows, lambda at: self._take("obs", at))
        return self._gather(name, rows)

    def _gather(self, name: str, rows: np.ndarray) -> Columnar:
        """Column `name` at `rows`, read from each shard's file."""
        shard = np.searchsorted(self._ends, rows, side="right")
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self._shards) + 1))
        chunks = [
            map_columnar(self._shards[index][name], lambda leaf: leaf[rows[order[bounds[index] : bounds[index + 1]]] - self._starts[index]])
            for index in np.flatnonzero(np.diff(bounds))
        ]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return _reorder(chunks, inverse)

    @property
    def obs(self) -> Columnar:
        """Every observation as one in-RAM array (a copy: observation statistics need them all)."""
        return self.column("obs")

    def column(self, name: str) -> Columnar:
        """A whole column as one in-RAM array (a copy, read with `pread`)."""
        if name in self._resident:
            return map_columnar(self._resident[name], np.array)
        if name == "next_obs" and self._following is not None:
            return self._take(name, np.arange(len(self)))
        if isinstance(self._shards[0][name], PackedBits):
            return np.concatenate([shard[name].read_all() for shard in self._shards])
        return self._read_column([shard[name] for shard in self._shards])

    def _read_column(self, leaves: list) -> Columnar:
        """Per-shard `PreadColumn`s (or dicts of them) read into one preallocated array each."""
        if isinstance(leaves[0], dict):
            return {key: self._read_column([leaf[key] for leaf in leaves]) for key in leaves[0]}
        out = np.empty((len(self),) + leaves[0].row_shape, leaves[0].dtype)
        for leaf, start in zip(leaves, self._starts):
            leaf.read_into(out[start : start + leaf.rows])
        return out

    def close(self) -> None:
        """Close the `pread` file descriptors (the maps close with the arrays that view them)."""
        for fd in self._files:
            os.close(fd)
        self._files = []


class _StoredFrames:
    """The next_obs frames a compressed dataset stores (at `breaks`), gathered from the files
    by their positions in `breaks`."""

    def __init__(self, data: MappedTransitions, breaks: np.ndarray) -> None:
        self.data, self.breaks = data, breaks

    def __getitem__(self, positions: np.ndarray) -> Columnar:
        return self.data._gather("next_obs", self.breaks[positions])


def _nbytes(column: PackedBits | PreadColumn | FrameColumn | dict[str, Any]) -> int:
    """A column's bytes (bit-packed for booleans, decoded for compressed frames)."""
    if isinstance(column, PackedBits):
        return column.data.nbytes
    if isinstance(column, (PreadColumn, FrameColumn)):
        return column.rows * column.row_bytes
    return sum(_nbytes(sub) for sub in column.values())


def _reorder(chunks: list[Columnar], inverse: np.ndarray | None) -> Columnar:
    """Concatenate per-shard chunks, then put the rows back in the requested order."""
    if isinstance(chunks[0], dict):
        return {key: _reorder([chunk[key] for chunk in chunks], inverse) for key in chunks[0]}
    joined = chunks[0] if len(chunks) == 1 else np.concatenate(cast("list[np.ndarray]", chunks))
    return joined if inverse is None else joined[inverse]
