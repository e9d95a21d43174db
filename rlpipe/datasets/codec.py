"""Compressed image columns: uint8 frames stored one compressed block per row, and next_obs
stored only where it is not the next row's obs.

An image observation (`rlpipe.envs.spaces.is_image_space`) of uint8 values becomes a
`large_binary` column holding each frame as one raw LZ4 block (Arrow's `lz4_raw` codec: no
dependency beyond pyarrow), marked in the field's metadata (`rlpipe.frame_codec`) and in the
dataset's metadata (`frame_codec`). LZ4 rather than zstd: random Breakout frames (84x84x1)
take 412 bytes against zstd's 290, but pyarrow decodes one in 1 µs against zstd's 24-39 µs
(it builds a context per call), and samplers decode each gathered frame. `next_obs` is null
where it equals the next row's `obs` in the same episode, so a chained episode stores its
final observation once. Bool frames (MinAtar) stay bit-packed fixed-size lists: LZ4 would
take a packed 10x10x4 board from 50 to 28 bytes, and a null next_obs save 50 more (124 bytes
a step to about 60: 60 MB per million steps), but the memory-mapped sampler gathers packed
bits with vectorised numpy from 50 MB of RAM per million steps, which a decode per frame
would slow.
"""

from __future__ import annotations

import json

import gymnasium as gym
import lz4.block
import numpy as np
import pyarrow as pa

from rlpipe.envs.spaces import is_image_space
from rlpipe.errors import RlpipeError

FRAME_CODEC = "lz4_raw"
CODEC_FIELD_KEY = b"rlpipe.frame_codec"
SHAPE_FIELD_KEY = b"rlpipe.frame_shape"  # the frames' shape as the writer held it: a reader checks the space against it
_CODEC = pa.Codec(FRAME_CODEC)


class CorruptFrame(ValueError):
    """A stored frame that does not decode to one observation (the message names its row)."""


def compressible(space: gym.Space) -> bool:
    """Whether `space`'s values are stored compressed: uint8 image Boxes."""
    return is_image_space(space) and np.dtype(space.dtype) == np.uint8


def check_frame_codec(codec: object, space: gym.Space) -> None:
    """Raise unless `codec` (metadata `frame_codec`) is None, or the codec rlpipe writes for a
    compressible observation space."""
    if codec is None:
        return
    if codec != FRAME_CODEC:
        raise RlpipeError(f"'frame_codec' is {codec!r}: this rlpipe reads {FRAME_CODEC!r} (upgrade rlpipe)")
    if not compressible(space):
        raise RlpipeError(f"'frame_codec' is set, but the observation space {space} is not a uint8 image")


def frame_field(name: str, shape: tuple[int, ...], nullable: bool = False) -> pa.Field:
    """The Arrow field of a compressed image column of frames of `shape`."""
    metadata = {CODEC_FIELD_KEY: FRAME_CODEC.encode(), SHAPE_FIELD_KEY: json.dumps(list(shape)).encode()}
    return pa.field(name, pa.large_binary(), nullable=nullable, metadata=metadata)


def frame_shape_problem(field: pa.Field, expected: pa.Field) -> str | None:
    """Why a shard's image column `field` does not hold the frames `expected` (the dataset's
    spaces imply) does, or None. A field records the shape it was written with; shards written
    before rlpipe recorded it carry none, and only the decoder's length check guards them.
    Every shard of compressed frames names its codec: another codec, or none, is refused
    rather than decoded as LZ4."""
    codec = (field.metadata or {}).get(CODEC_FIELD_KEY)
    if codec != FRAME_CODEC.encode():
        named = "names no frame codec" if codec is None else f"names frame codec {codec.decode(errors='replace')!r}"
        return f"column {field.name!r} {named}, not {FRAME_CODEC!r}"
    recorded = (field.metadata or {}).get(SHAPE_FIELD_KEY)
    if recorded is None:
        return None
    wanted = json.loads(expected.metadata[SHAPE_FIELD_KEY])
    try:
        written = json.loads(recorded)
    except (ValueError, UnicodeDecodeError, RecursionError):  # nested past Python's stack: unreadable too
        return f"column {field.name!r} records an unreadable frame shape"
    if written != wanted:
        return f"column {field.name!r} holds frames of shape {written}, the dataset's observation space has {wanted}"
    return None


def is_frame_column(column: pa.Array) -> bool:
    """Whether an Arrow column holds compressed frames (a binary image column)."""
    return pa.types.is_large_binary(column.type)


def chained_rows(obs: np.ndarray, next_obs: np.ndarray, episode_id: np.ndarray) -> np.ndarray:
    """Per row, whether its next_obs is the next row's obs in the same episode (bit for bit);
    the last row never is."""
    count = len(episode_id)
    chained = np.zeros(count, bool)
    if count > 1:
        same = np.asarray(episode_id[1:]) == np.asarray(episode_id[:-1])
        flat_next, flat_obs = (np.ascontiguousarray(a).reshape(count, -1) for a in (next_obs, obs))
        chained[:-1] = same & (flat_next[:-1] == flat_obs[1:]).all(axis=1)
    return chained


def encode_frames(frames: np.ndarray, skip: np.ndarray | None = None) -> pa.Array:
    """One compressed block per frame, as a large_binary array; rows where `skip` is true are null."""
    flat = np.ascontiguousarray(frames, np.uint8).reshape(len(frames), -1)
    skipped = np.zeros(len(flat), bool) if skip is None else skip
    blocks = [None if gap else _CODEC.compress(row, asbytes=True) for row, gap in zip(flat, skipped.tolist())]
    return pa.array(blocks, pa.large_binary())


def block_bounds(column: pa.Array) -> np.ndarray:
    """Where each row's block starts in the column's value buffer, and the last one's end (int64, rows + 1)."""
    return np.frombuffer(column.buffers()[1], np.int64)[column.offset : column.offset + len(column) + 1]


def decode_block(block: bytes | memoryview, out: np.ndarray) -> None:
    """Decode one block into `out` (one frame's bytes, a 1-D uint8 row); ValueError unless it
    holds exactly that many bytes. python-lz4 returns the bytes the decoder wrote: pyarrow's
    codec returns the size asked for, its tail uninitialised memory when the block holds less."""
    try:
        frame = lz4.block.decompress(block, uncompressed_size=len(out))
    except (lz4.block.LZ4BlockError, ValueError) as exc:
        raise ValueError(str(exc).strip().rstrip(".")) from None
    if len(frame) != len(out):
        raise ValueError(f"it holds {len(frame)} bytes, not {len(out)}")
    out[:] = np.frombuffer(frame, np.uint8)


def decode_frames(column: pa.Array, shape: tuple[int, ...]) -> np.ndarray:
    """A compressed image column as `[rows, *shape]` uint8 frames (null rows are zeros; see
    `fill_chained`). CorruptFrame naming the first row whose block does not decode."""
    out = np.zeros((len(column), int(np.prod(shape, dtype=np.int64))), np.uint8)
    if len(column) == 0:
        return out.reshape((0, *shape))
    bounds = block_bounds(column).tolist()
    values = memoryview(column.buffers()[2] or b"")
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(valid).tolist():
        try:
            decode_block(values[bounds[row] : bounds[row + 1]], out[row])
        except ValueError as exc:
            raise CorruptFrame(f"frame at row {row} does not decode ({exc})") from None
    return out.reshape((len(column), *shape))


def fill_chained(next_obs: np.ndarray, column: pa.Array, obs: np.ndarray) -> np.ndarray:
    """`next_obs` decoded from `column` with its null rows filled by the next row's obs."""
    missing = np.flatnonzero(~column.is_valid().to_numpy(zero_copy_only=False))
    next_obs[missing] = obs[missing + 1]  # the checks refused a null on a shard's last row
    return next_obs


def unchained_null(column: pa.Array, episode_id: np.ndarray) -> int | None:
    """The first row whose next_obs is null though no row of its episode follows it, or None."""
    missing = ~column.is_valid().to_numpy(zero_copy_only=False)
    ends = np.r_[np.asarray(episode_id[1:]) != np.asarray(episode_id[:-1]), True]
    bad = np.flatnonzero(missing & ends)
    return int(bad[0]) if len(bad) else None
