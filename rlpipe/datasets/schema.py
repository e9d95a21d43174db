"""The step-table schema: how gymnasium spaces map to Arrow columns and back to numpy.

One row per transition. A Box space becomes a fixed-size list column (flattened; the shape
lives in the serialized space in metadata.json), Discrete an int64 column, MultiDiscrete and
MultiBinary fixed-size integer lists, and a Dict space a struct column with one child per key
(so polars sees `obs.observation`, `obs.achieved_goal`, ...). uint8 image observations are
compressed frames instead (`rlpipe.datasets.codec`) when the dataset's metadata says so.
"""

from __future__ import annotations

import os
from typing import Any, Union, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.codec import check_frame_codec, decode_frames, frame_field, is_frame_column
from rlpipe.errors import RlpipeError

FORMAT_NAME = "rlpipe-dataset"
FORMAT_VERSION = 2  # the newest version read; 2 adds compressed image columns (`frame_codec`)
PLAIN_FORMAT_VERSION = 1  # what datasets without compressed columns are still written as, so older rlpipe reads them

# A column's values: an array with the row axis first, or a dict of those for Dict spaces.
Columnar = Union[np.ndarray, dict[str, "Columnar"]]  # noqa: UP007 (a runtime alias: `|` cannot join a string forward reference)

SPACE_COLUMNS = ("obs", "action", "next_obs")
INFO_COLUMNS = ("info", "next_info")  # selected env info keys, with obs and with next_obs
SCALAR_COLUMNS: dict[str, pa.DataType] = {
    "episode_id": pa.int64(),
    "step": pa.int32(),
    "reward": pa.float32(),
    "terminated": pa.bool_(),
    "truncated": pa.bool_(),
}


def leaf_dtype(space: gym.Space) -> np.dtype:
    """The numpy dtype one element of a (non-Dict) space is stored as."""
    if isinstance(space, gym.spaces.Box):
        return np.dtype(space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.dtype(np.int8)
    raise RlpipeError(f"unsupported space {space!r}: datasets store Box, Discrete, MultiDiscrete, MultiBinary and Dict")


def leaf_shape(space: gym.Space) -> tuple[int, ...]:
    """The per-row shape of a (non-Dict) space's values."""
    return () if isinstance(space, gym.spaces.Discrete) else tuple(cast("tuple[int, ...]", space.shape))  # set for non-Dict spaces


def arrow_type(space: gym.Space) -> pa.DataType:
    """The Arrow type of a column holding values of `space`."""
    if isinstance(space, gym.spaces.Dict):
        return pa.struct([pa.field(key, arrow_type(sub), nullable=False) for key, sub in space.spaces.items()])
    value_type = pa.from_numpy_dtype(leaf_dtype(space))
    shape = leaf_shape(space)
    return value_type if shape == () else pa.list_(value_type, int(np.prod(shape)))


def step_schema(
    observation_space: gym.Space,
    action_space: gym.Space,
    multi_agent: bool = False,
    info_space: gym.spaces.Dict | None = None,
    frame_codec: str | None = None,
) -> pa.Schema:
    """The Arrow schema of a dataset's step table (`info`/`next_info` columns when `info_space`
    is given; compressed image columns, next_obs nullable, with a `frame_codec`)."""
    check_frame_codec(frame_codec, observation_space)
    frame_shape = cast("tuple[int, ...]", observation_space.shape)  # with a frame_codec, a uint8 image Box (checked above)
    obs, next_obs = (
        (frame_field("obs", frame_shape), frame_field("next_obs", frame_shape, nullable=True))
        if frame_codec
        else (pa.field(name, arrow_type(observation_space), nullable=False) for name in ("obs", "next_obs"))
    )
    fields = [
        pa.field("episode_id", SCALAR_COLUMNS["episode_id"], nullable=False),
        pa.field("step", SCALAR_COLUMNS["step"], nullable=False),
    ]
    if multi_agent:
        fields.append(pa.field("agent", pa.string(), nullable=False))
    fields += [
        obs,
        pa.field("action", arrow_type(action_space), nullable=False),
        pa.field("reward", SCALAR_COLUMNS["reward"], nullable=False),
        next_obs,
        pa.field("terminated", SCALAR_COLUMNS["terminated"], nullable=False),
        pa.field("truncated", SCALAR_COLUMNS["truncated"], nullable=False),
    ]
    if info_space is not None:
        fields += [pa.field(name, arrow_type(info_space), nullable=False) for name in INFO_COLUMNS]
    return pa.schema(fields)


def info_value_space(value: np.ndarray) -> gym.spaces.Box | None:
    """The space an info value (one env's, no row axis) is stored under; None for values that
    are not numbers or booleans (strings, objects), which are not stored."""
    value = np.asarray(value)
    if value.dtype == np.bool_:
        return gym.spaces.Box(0, 1, value.shape, np.bool_)  # type: ignore[arg-type]  # gymnasium annotates float and int dtypes only
    if np.issubdtype(value.dtype, np.integer):
        bounds = np.iinfo(value.dtype)
        return gym.spaces.Box(bounds.min, bounds.max, value.shape, value.dtype)
    if np.issubdtype(value.dtype, np.floating):
        return gym.spaces.Box(-np.inf, np.inf, value.shape, value.dtype)
    return None


def to_arrow(values: Columnar, space: gym.Space) -> pa.Array:
    """Turn a column's numpy values into an Arrow array (zero-copy for contiguous numeric data)."""
    if isinstance(space, gym.spaces.Dict):
        children = [to_arrow(values[key], sub) for key, sub in space.spaces.items()]
        return pa.StructArray.from_arrays(children, names=list(space.spaces.keys()))
    array = np.ascontiguousarray(values, dtype=leaf_dtype(space))
    shape = leaf_shape(space)
    if shape == ():
        return pa.array(array.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), int(np.prod(shape)))


def from_arrow(column: pa.Array, space: gym.Space) -> Columnar:
    """Turn one Arrow array (a single chunk) back into numpy, zero-copy where the dtype allows;
    compressed frames are decoded (null next_obs rows are zeros: `codec.fill_chained`)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: from_arrow(column.field(key), sub) for key, sub in space.spaces.items()}
    shape = leaf_shape(space)
    if is_frame_column(column):
        return decode_frames(column, shape)
    flat = column if shape == () else column.flatten()
    return flat.to_numpy(zero_copy_only=False).reshape((len(column),) + shape)


def scalar_from_arrow(column: pa.Array) -> np.ndarray:
    """A scalar column as numpy: zero-copy for numbers, one unpacking pass for bit-packed booleans."""
    return column.to_numpy(zero_copy_only=False)


def num_rows(values: Columnar) -> int:
    """The row count of a column's values."""
    while isinstance(values, dict):
        values = next(iter(values.values()))
    return len(values)


def map_columnar(values: Columnar, fn: Any) -> Columnar:
    """Apply `fn` to every leaf array of a (possibly nested) column."""
    if isinstance(values, dict):
        return {key: map_columnar(sub, fn) for key, sub in values.items()}
    return fn(values)


def concat_columnar(parts: list[Columnar]) -> Columnar:
    """Concatenate column values along the row axis, leaf by leaf."""
    if isinstance(parts[0], dict):
        return {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}
    return parts[0] if len(parts) == 1 else np.concatenate(cast("list[np.ndarray]", parts))


# Opt-in for data with NaN or infinite floats (refused by default: they train silently into NaN weights).
ALLOW_NONFINITE_ENV = "RLPIPE_ALLOW_NONFINITE"


def non_finite_allowed() -> bool:
    """Whether the user opted in to NaN/infinite values (`RLPIPE_ALLOW_NONFINITE=1`)."""
    return os.environ.get(ALLOW_NONFINITE_ENV, "") not in ("", "0")


def non_finite_problem(rows: dict[str, Columnar], first_row: int = 0) -> str | None:
    """Where a float column (obs, action, reward, next_obs) first holds NaN or infinity (rows
    numbered from `first_row`), or None; None as well when the user opted in."""
    if non_finite_allowed():
        return None
    for key in ("obs", "action", "reward", "next_obs"):
        leaves: list[np.ndarray] = []
        map_columnar(rows[key], lambda a: leaves.append(np.asarray(a)))
        bad = [leaf for leaf in leaves if leaf.dtype.kind == "f" and not np.isfinite(leaf).all()]
        if bad:
            row = min(int(np.flatnonzero(~np.isfinite(leaf).reshape(len(leaf), -1).all(axis=1))[0]) for leaf in bad)
            return f"column {key!r} holds NaN or infinite values at row {first_row + row} (set {ALLOW_NONFINITE_ENV}=1 to accept them)"
    return None


def check_finite(rows: dict[str, Columnar], where: str) -> None:
    """Raise if a float column holds NaN or infinity (see `non_finite_problem`)."""
    problem = non_finite_problem(rows)
    if problem:
        raise RlpipeError(f"{where}: {problem}")
