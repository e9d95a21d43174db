"""Importing data logged without a simulator: a table of transitions (Parquet, CSV, Arrow
IPC), arrays (NumPy .npz with D4RL's names, D4RL's HDF5, OGBench's .npz) or a LeRobotDataset
v3 directory becomes a dataset.

Tables stream a batch of rows at a time (Parquet row groups, CSV blocks, IPC batches) and
HDF5 a slice at a time, so memory holds one batch plus the episode it ends in; an .npz file
is read whole (NumPy cannot map its members). Each role has default column names (`DEFAULT_NAMES`;
an array file's keys are its columns) and `--obs-columns a,b,c` concatenates scalar columns.

Episodes are runs of one `episode` value when the data has that column (its rows grouped,
its `step` counting up by 1), else they end at each terminated or truncated row, D4RL's
convention; rows after the last flagged one form an episode cut off by the file's end. An
episode whose last row has neither flag is marked truncated (nothing says it ended). Without
a next-observation column, next_obs[t] is obs[t + 1] of the same episode, and an episode's
last row keeps its own obs as next_obs when it is terminated (nothing is bootstrapped past
it) and is dropped when it is truncated (its next observation is unknown; the row before it
becomes the truncated last row), as D4RL's `qlearning_dataset` and d3rlpy do for timeouts.

A LeRobot dataset is its data files (data/chunk-NNN/file-NNN.parquet, in order) read as one
table whose rows are frames: observation.state (else observation.image, PNG or JPEG frames
decoded to uint8 images), action, next.reward (0 when the data has none, which the metadata
records), next.done as terminated, next.truncated, episode_index as the episode and
frame_index as the step; LeRobot's timestamp, index and task_index are left out, and the
shapes of meta/info.json's features are checked on every row. Frames hold no next
observation, so the convention above gives them. A video feature (dtype "video") is a column
like the others, of uint8 height x width x 3 frames decoded with PyAV (the rlpipe[lerobot]
extra) when a role maps it (--obs-column observation.images.top); one left out with
--ignore-columns is not decoded. Each frame is the decoded frame nearest to its episode's
from_timestamp (meta/episodes) plus its row's timestamp, in the file info.json's video_path
names, and must lie within LeRobot's tolerance_s (1e-4 s) of it, as LeRobotDataset requires;
each video file is decoded forward once, a frame at a time, converted to rgb24. Batches of
image or video rows hold about FRAME_BATCH_BYTES of pixels. Video codecs are lossy, so the
frames are the video's, not the camera's (docs/datasets.md states the PSNR measured).

OGBench's files store each trajectory's final state as a row of its own (`valids` 0, or
`terminals` 1 without `valids`): it becomes the previous row's next_obs, and the trajectory
ends truncated, as OGBench's trajectories end on a time limit, unless the file has
`terminations` (rlpipe's `--to ogbench` export) and it is 1 there; rewards are 0 unless the
file has `rewards` (OGBench's goal-reaching rewards come from relabelling).

Spaces come from `--env` (its spaces, which the data must fit), from `--action-space`
(`box:LOW,HIGH` or `discrete:N`, checked on every row) or from the data: observations a Box
of their dtype (unbounded floats, integers over their dtype's range), integer actions
Discrete(max + 1) (MultiDiscrete for several columns), float actions a Box over their
per-dimension min and max. Anything inconsistent is one RlpipeError naming the row (rows
count from 0) and the column, raised before the writer publishes, so nothing is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.exports import LEROBOT_INFO_PATH
from rlpipe.datasets.exports import METADATA_KEY as EXPORT_METADATA_KEY
from rlpipe.datasets.schema import ALLOW_NONFINITE_ENV, non_finite_allowed
from rlpipe.datasets.store import check_name
from rlpipe.datasets.writer import DatasetWriter
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import loads_json, read_limited, sha256_file

SOURCE_FORMATS = ("minari", "parquet", "csv", "arrow", "npz", "d4rl", "ogbench", "lerobot")
TABLE_FORMATS = ("parquet", "csv", "arrow", "lerobot")  # array formats ignore keys they do not map (D4RL's infos/, OGBench's qpos)
BATCH_ROWS = 1 << 16
CSV_BLOCK_BYTES = 8 << 20

# Roles, the names looked for when a role's column is not given, and which roles must be present.
DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "obs": ("obs", "observation", "observations"),
    "action": ("action", "actions"),
    "reward": ("reward", "rewards"),
    "terminated": ("terminated", "terminal", "terminals"),
    "truncated": ("truncated", "timeout", "timeouts"),
    "next_obs": ("next_obs", "next_observation", "next_observations"),
    "episode": ("episode_id", "episode"),
    "step": ("step",),
}
REQUIRED_ROLES = ("obs", "action", "reward")
ZERO_REWARD = "(no reward column: 0)"  # the column of zeros a LeRobot dataset without next.reward gets
# A LeRobot dataset's columns for each role (the first one present) and the bookkeeping columns left out.
LEROBOT_NAMES: dict[str, tuple[str, ...]] = {
    "obs": ("observation.state", "observation.image"),
    "action": ("action",),
    "reward": ("next.reward", ZERO_REWARD),
    "terminated": ("next.done",),
    "truncated": ("next.truncated",),
    "episode": ("episode_index",),
    "step": ("frame_index",),
}
LEROBOT_LEFT_OUT = ("timestamp", "index", "task_index")
LEROBOT_EPISODES_GLOB = "meta/episodes/*/*.parquet"
LEROBOT_EXTRA = "lerobot"  # the extra that installs PyAV
LEROBOT_TOLERANCE_S = 1e-4  # LeRobotDataset's default tolerance_s between a frame's timestamp and its decoded frame's
FRAME_BATCH_BYTES = 256 << 20  # decoded image or video pixels per batch of LeRobot rows (fewer rows than BATCH_ROWS for large frames)
VECTOR_ROLES = ("obs", "next_obs", "action")  # roles that may concatenate several scalar columns
FLOAT_ROLES = ("obs", "next_obs", "action", "reward")  # checked for NaN and infinity


@dataclass
class _Rows:
    """Consecutive source rows by role (obs, action, ...), the first being row `first` of the file."""

    first: int
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["reward"])

    def part(self, start: int, stop: int) -> _Rows:
        return _Rows(self.first + start, {role: values[start:stop] for role, values in self.columns.items()})

    def then(self, later: _Rows) -> _Rows:
        return _Rows(self.first, {role: np.concatenate([values, later.columns[role]]) for role, values in self.columns.items()})


@dataclass
class _Source:
    """An opened file: what each role's column is called in it, and its rows in batches."""

    where: str  # the file's name, which messages start with
    names: dict[str, tuple[str, ...]]
    batches: Iterator[_Rows]
    # What a Parquet file `rlpipe datasets export` wrote records: its dataset's metadata.json,
    # and the shape of each list column's values (images are stored flat).
    recorded: dict[str, Any] | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    images: bool = False  # decode Hugging Face image columns (structs of encoded bytes and a path), as LeRobot stores images
    inputs: list[Path] | None = None  # the files whose bytes and sha256 the metadata records, where they are several

    def fail(self, row: int, role: str, problem: str, column: int = 0) -> RlpipeError:
        """One line naming the file, the row and the source column of `role` (`column`: which of several)."""
        names = self.names.get(role, (role,))
        return RlpipeError(f"{self.where}: row {row}, column {names[min(column, len(names) - 1)]!r}: {problem}")


def parse_action_space(text: str) -> tuple[str, float, float] | tuple[str, int]:
    """`box:LOW,HIGH` or `discrete:N`, checked before any file is read."""
    kind, _, value = text.partition(":")
    try:
        if kind == "box":
            low, high = (float(part) for part in value.split(","))
            if low < high:
                return ("box", low, high)
        elif kind == "discrete" and int(value) > 0:
            return ("discrete", int(value))
    except ValueError:
        pass
    raise RlpipeError(f"--action-space takes box:LOW,HIGH (LOW < HIGH) or discrete:N (N > 0), got {text!r}")


def resolve_columns(given: dict[str, tuple[str, ...]], available: Sequence[str], where: str) -> dict[str, tuple[str, ...]]:
    """Each role's columns: the given ones (which must exist), else the first default name present."""
    unknown = sorted(set(given) - set(DEFAULT_NAMES))
    if unknown:
        raise RlpipeError(f"unknown column role {unknown[0]!r}: the roles are {', '.join(DEFAULT_NAMES)}")
    held = ", ".join(available[:20]) + (f", ... ({len(available)} columns)" if len(available) > 20 else "")
    resolved = {}
    for role, defaults in DEFAULT_NAMES.items():
        names = given.get(role) or next(((name,) for name in defaults if name in available), None)
        if names is not None and len(names) > 1 and role not in VECTOR_ROLES:
            raise RlpipeError(f"{where}: {role} is one column, not {len(names)}")
        if names is None and role in REQUIRED_ROLES:
            raise RlpipeError(f"{where}: no {role} column (looked for {', '.join(defaults)}; it holds {held})")
        missing = [name for name in names or () if name not in available]
        if missing:
            raise RlpipeError(f"{where}: no column {missing[0]!r} for {role} (it holds {held})")
        if names is not None:
            resolved[role] = names
    return resolved


# ---- tables: Parquet, CSV, Arrow IPC --------------------------------------------------------


def _table_source(path: Path, kind: str, given: dict[str, tuple[str, ...]], ignore: tuple[str, ...], declared: tuple | None) -> _Source:
    """A table's columns resolved (every column mapped or ignored) and its batches as rows."""
    where = path.name
    opened = _open_table(path, kind, where)
    names = _mapped_columns(given, opened.schema.names, ignore, where)
    if kind == "csv":  # the text has no dtype: floats become float32, most envs' dtype (Parquet keeps float64)
        opened = _open_csv(path, where, _csv_types(names, opened.schema, declared))
    return _rows_source(where, names, opened)


def _mapped_columns(
    given: dict[str, tuple[str, ...]], available: Sequence[str], ignore: Sequence[str], where: str
) -> dict[str, tuple[str, ...]]:
    """`resolve_columns`, and every other column left out on purpose (else one refusal)."""
    names = resolve_columns(given, available, where)
    mapped = {name for columns in names.values() for name in columns}
    extra = [name for name in available if name not in mapped and name not in ignore]
    if extra:
        raise RlpipeError(f"{where}: column {extra[0]!r} is not mapped to a role (map it, or pass --ignore-columns {extra[0]})")
    return names


def _rows_source(where: str, names: dict[str, tuple[str, ...]], reader: Any, shapes: dict[str, tuple[int, ...]] | None = None) -> _Source:
    """A source whose rows are `reader`'s record batches; `shapes` adds value shapes to those its schema records."""
    recorded, recorded_shapes = _recorded_layout(reader.schema, names, where)
    source = _Source(where, names, iter(()), recorded, {**recorded_shapes, **(shapes or {})})
    source.batches = _table_rows(source, reader)
    return source


def _recorded_layout(
    schema: pa.Schema, names: dict[str, tuple[str, ...]], where: str
) -> tuple[dict[str, Any] | None, dict[str, tuple[int, ...]]]:
    """The dataset metadata and value shapes an rlpipe export recorded in a table's schema
    (`rlpipe.datasets.exports`), for the roles that read one column each; none elsewhere."""
    recorded = None
    text = (schema.metadata or {}).get(EXPORT_METADATA_KEY.encode())
    if text is not None:
        try:
            recorded = json.loads(text)
        except (ValueError, RecursionError):
            raise RlpipeError(f"{where}: its {EXPORT_METADATA_KEY!r} metadata is not JSON") from None
        if not isinstance(recorded, dict):
            raise RlpipeError(f"{where}: its {EXPORT_METADATA_KEY!r} metadata is not a JSON object")
    shapes = {}
    for role, columns in names.items():
        field_metadata = schema.field(columns[0]).metadata or {} if len(columns) == 1 else {}
        if b"shape" in field_metadata:
            try:
                shape = tuple(int(n) for n in json.loads(field_metadata[b"shape"]))
            except (ValueError, TypeError, RecursionError):
                raise RlpipeError(f"{where}: column {columns[0]!r} records a shape that is not a list of sizes") from None
            shapes[role] = shape
    return recorded, shapes


def _open_table(path: Path, kind: str, where: str) -> Any:
    """A reader with `.schema` that iterates record batches."""
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering reads every row group ahead: RSS as large as the file
            return _Batches(parquet.schema_arrow, parquet.iter_batches(batch_size=BATCH_ROWS))
        if kind == "arrow":
            try:
                reader = pa.ipc.open_file(pa.memory_map(str(path)))
                return _Batches(reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches)))
            except pa.ArrowInvalid:  # not the file format: the stream format
                return pa.ipc.open_stream(pa.memory_map(str(path)))
        return _open_csv(path, where, {})
    except (pa.ArrowException, OSError) as exc:
        raise RlpipeError(f"{where}: cannot read it as {kind}: {_reason(exc)}") from None


@dataclass
class _Batches:
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.batches


def _open_csv(path: Path, where: str, types: dict[str, pa.DataType]) -> Any:
    import pyarrow.csv as pacsv

    try:  # one thread: pyarrow's messages then name the line of a malformed row
        return pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=False),
            convert_options=pacsv.ConvertOptions(column_types=types),
        )
    except (pa.ArrowException, OSError) as exc:
        raise RlpipeError(f"{where}: cannot read it as csv: {_reason(exc)}") from None


def _csv_types(names: dict[str, tuple[str, ...]], inferred: pa.Schema, declared: tuple | None) -> dict[str, pa.DataType]:
    """Column types for CSV text: float32 observations and rewards; actions float32 unless they
    are integers (inferred from the first block, or declared discrete)."""
    types = {name: pa.float32() for role in ("obs", "next_obs", "reward") for name in names.get(role, ())}
    discrete = declared[0] == "discrete" if declared else all(pa.types.is_integer(inferred.field(n).type) for n in names["action"])
    types.update({name: pa.int64() if discrete else pa.float32() for name in names["action"]})
    return types


def _table_rows(source: _Source, reader: Any) -> Iterator[_Rows]:
    first = 0
    batches = iter(reader)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise RlpipeError(f"{source.where}: after row {first}: {_csv_column_named(_reason(exc), reader.schema)}") from None
        if batch is None:
            return
        if batch.num_rows:
            yield _Rows(first, {role: _column(source, batch, role, first) for role in source.names})
        first += batch.num_rows


def _csv_column_named(reason: str, schema: pa.Schema) -> str:
    """pyarrow's 'In CSV column #3: ...' with the column's name."""
    return re.sub(r"CSV column #(\d+)", lambda m: f"column {schema.names[int(m.group(1))]!r}", reason)


def _column(source: _Source, batch: pa.RecordBatch, role: str, first: int) -> np.ndarray:
    """A role's values in one batch: scalar columns stacked side by side, or one list column as rows of equal length."""
    names = source.names[role]
    parts = [_values(source, batch.column(name), role, first, i) for i, name in enumerate(names)]
    if len(parts) == 1:
        rows = _as_rows(parts[0], role)
        shape = source.shapes.get(role)
        if shape is not None and len(rows) and math.prod(shape) != math.prod(rows.shape[1:]):
            raise source.fail(
                first, role, f"holds {math.prod(rows.shape[1:])} values, but its recorded shape {shape} holds {math.prod(shape)}"
            )
        return rows if shape is None else rows.reshape(len(rows), *shape)
    nested = next((i for i, part in enumerate(parts) if part.ndim > 1), None)
    if nested is not None:
        raise source.fail(first, role, f"is a list column; name it alone (--{role.replace('_', '-')}-column)", nested)
    return np.stack(parts, axis=1)


def _values(source: _Source, column: pa.Array, role: str, first: int, index: int) -> np.ndarray:
    """One Arrow column as numpy: nulls refused, a list column as a 2-D array."""
    if column.null_count:
        raise source.fail(first + _first_true(column.is_null()), role, "is empty (null)", index)
    if source.images and pa.types.is_struct(column.type) and column.type.get_field_index("bytes") >= 0:
        return _decoded_images(source, column, role, first, index)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and np.any(lengths != lengths[0]):
            row = int(np.flatnonzero(lengths != lengths[0])[0])
            raise source.fail(first + row, role, f"holds {lengths[row]} values where row {first} holds {lengths[0]}", index)
        flat = column.flatten()
        if flat.null_count:
            import pyarrow.compute as pc

            row = pc.list_parent_indices(column).to_numpy()[_first_true(flat.is_null())]
            raise source.fail(first + int(row), role, "holds an empty (null) value", index)
        return flat.to_numpy(zero_copy_only=False).reshape(len(column), -1)
    if role != "episode" and not (
        pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)
    ):
        raise source.fail(first, role, f"holds {column.type}, not numbers", index)
    return column.to_numpy(zero_copy_only=False)


def _first_true(mask: pa.Array) -> int:
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _decoded_images(source: _Source, column: pa.Array, role: str, first: int, index: int) -> np.ndarray:
    """A Hugging Face image column (PNG or JPEG bytes) as rows of uint8 pixels, every image of the first one's shape."""
    from PIL import Image, UnidentifiedImageError

    rows: list[np.ndarray] = []
    for row, encoded in enumerate(column.field("bytes").to_pylist()):
        if encoded is None:
            raise source.fail(first + row, role, "holds an image without its bytes (a path only)", index)
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                pixels = np.asarray(image.convert("RGB") if image.mode == "P" else image)  # palette indices are no pixels
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise source.fail(first + row, role, f"holds an image that cannot be decoded: {_reason(exc)}", index) from None
        if pixels.dtype != np.uint8 or (rows and pixels.shape != rows[0].shape):
            expected = f"uint8 {rows[0].shape}" if rows else "uint8"
            raise source.fail(first + row, role, f"holds a {pixels.dtype} image of shape {pixels.shape}, not {expected}", index)
        rows.append(pixels)
    return np.stack(rows).reshape(len(rows), -1)


# ---- LeRobotDataset v3: meta/info.json and the data Parquet files -------------------------------


def _lerobot_source(root: Path, given: dict[str, tuple[str, ...]], ignore: tuple[str, ...]) -> _Source:
    """A LeRobot dataset's data files as one table (module doc): LeRobot's names for the roles not
    given, the bookkeeping columns left out, info.json's feature shapes checked on every row, and
    each video feature a role maps decoded into a column of frames."""
    where = root.name
    info = _lerobot_info(root, where)
    files = _lerobot_data_files(root)
    if not files:
        raise RlpipeError(f"{where}: no data files (data/chunk-*/file-*.parquet)")
    features = info["features"]
    stored = _open_parquet(root, files[0], where).schema_arrow
    schema = stored
    if "reward" not in given and not any(name in stored.names for name in (*LEROBOT_NAMES["reward"], *DEFAULT_NAMES["reward"])):
        schema = stored.append(pa.field(ZERO_REWARD, pa.float32()))
    videos = {
        key: _video_shape(feature, key, where) for key, feature in features.items() if feature["dtype"] == "video" and key not in ignore
    }
    stored_too = [key for key in videos if key in stored.names]
    if stored_too:
        raise RlpipeError(f"{where}: feature {stored_too[0]!r} is a video in {LEROBOT_INFO_PATH} and a column of the data files")
    available = [*schema.names, *videos]
    defaults = {}
    for role, candidates in LEROBOT_NAMES.items():
        present = [name for name in candidates if name in available and name not in ignore]
        if present and role not in given:
            defaults[role] = (present[0],)
    names = _mapped_columns({**defaults, **given}, available, (*ignore, *LEROBOT_LEFT_OUT), where)
    mapped = [columns[0] for columns in names.values() if len(columns) == 1]
    shapes = {
        role: videos.get(columns[0]) or _lerobot_shape(features[columns[0]], role)
        for role, columns in names.items()
        if len(columns) == 1 and columns[0] in features
    }
    decoded = {key: shape for key, shape in videos.items() if key in mapped}
    frames = _LerobotVideos(root, info, decoded) if decoded else None
    for key, shape in frames.shapes.items() if frames else ():
        schema = schema.append(pa.field(key, pa.list_(pa.uint8(), math.prod(shape))))
    pixels = sum(math.prod(features[key]["shape"]) for key in mapped if features.get(key, {}).get("dtype") in ("image", "video"))
    rows = max(1, min(BATCH_ROWS, FRAME_BATCH_BYTES // pixels)) if pixels else BATCH_ROWS
    batches = _lerobot_batches(root, files, stored, schema, info["total_frames"], frames, rows)
    source = _rows_source(where, names, _Batches(schema, batches), shapes)
    source.images = True
    if frames is not None:
        source.inputs = [root / LEROBOT_INFO_PATH, *files, *frames.metadata_files, *frames.files]
    return source


def _lerobot_info(root: Path, where: str) -> dict[str, Any]:
    """meta/info.json, checked for what the import reads: a v3 codebase_version, features with
    a dtype and a shape, and total_frames."""
    try:  # links followed: the Hugging Face cache links a snapshot's files to its blobs
        info = loads_json(read_limited(root / LEROBOT_INFO_PATH, follow_links=True))
    except FileNotFoundError:
        raise RlpipeError(f"{where}: no {LEROBOT_INFO_PATH} (not a LeRobot dataset)") from None
    except OSError as exc:
        raise RlpipeError(f"{where}: cannot read {LEROBOT_INFO_PATH}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH} is not JSON: {_reason(exc)}") from None
    if not isinstance(info, dict):
        raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH} is not a JSON object")
    version = info.get("codebase_version")
    if not isinstance(version, str) or not version.startswith("v3."):
        raise RlpipeError(
            f"{where}: {LEROBOT_INFO_PATH} says codebase_version {version!r}: rlpipe reads LeRobot's v3 layout "
            "(LeRobot converts older datasets: python -m lerobot.scripts.convert_dataset_v21_to_v30)"
        )
    features = info.get("features")
    if not isinstance(features, dict):
        raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH} has no features")
    for key, feature in features.items():
        shape = feature.get("shape") if isinstance(feature, dict) else None
        sizes = isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
        if not (sizes and isinstance(feature.get("dtype"), str)):
            raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH}: feature {key!r} has no dtype and shape (a list of sizes)")
    total = info.get("total_frames")
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH}: total_frames is not a count")
    return info


def _lerobot_data_files(root: Path) -> list[Path]:
    """The data files in order (LeRobot's reader globs them so too)."""
    return sorted((root / "data").glob("*/*.parquet"))


def _lerobot_shape(feature: dict[str, Any], role: str) -> tuple[int, ...]:
    """The shape a role's values take: the feature's, but LeRobot's shape (1,) is a scalar for
    rewards, flags, ids, steps and integer (Discrete) actions."""
    shape = tuple(feature["shape"])
    scalar = role not in VECTOR_ROLES or (role == "action" and feature["dtype"].startswith(("int", "uint")))
    return () if shape == (1,) and scalar else shape


def _open_parquet(root: Path, path: Path, where: str) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path, pre_buffer=False)  # as _open_table's: one row group in memory at a time
    except (pa.ArrowException, OSError) as exc:
        raise RlpipeError(f"{where}/{path.relative_to(root)}: cannot read it as parquet: {_reason(exc)}") from None


def _lerobot_batches(
    root: Path,
    files: list[Path],
    stored: pa.Schema,
    schema: pa.Schema,
    total_frames: int,
    videos: _LerobotVideos | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The data files' record batches of `batch_rows` in order, of `schema` (`stored`, the first
    file's columns, which every file must have, then zero rewards where it has none, then the
    decoded `videos`); their frames must add up to info.json's total_frames."""
    where, frames = root.name, 0
    zero_reward = ZERO_REWARD in schema.names and ZERO_REWARD not in stored.names
    for path in files:
        parquet = _open_parquet(root, path, where)
        found = parquet.schema_arrow
        for name in dict.fromkeys([*stored.names, *found.names]):
            if name not in found.names or name not in stored.names or found.field(name).type != stored.field(name).type:
                held = found.field(name).type if name in found.names else "nothing"
                first = stored.field(name).type if name in stored.names else "nothing"
                raise RlpipeError(
                    f"{where}/{path.relative_to(root)}: column {name!r} holds {held}, {files[0].relative_to(root)} holds {first}"
                )
        for batch in parquet.iter_batches(batch_size=batch_rows):
            added = [pa.array(np.zeros(batch.num_rows, np.float32))] if zero_reward else []
            if videos is not None:
                added += videos.columns(batch, frames)
            if added:
                batch = pa.RecordBatch.from_arrays([*batch.columns, *added], schema=schema)
            frames += batch.num_rows
            yield batch
    if videos is not None:
        videos.close()
    if frames != total_frames:
        raise RlpipeError(f"{where}: its data files hold {frames} frames, {LEROBOT_INFO_PATH} says total_frames {total_frames}")


def _video_shape(feature: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    """A video feature's frame shape as rlpipe stores images, height x width x channels: its
    info.json shape, reordered where its names say channels come first."""
    shape, names = tuple(feature["shape"]), feature.get("names")
    if len(shape) != 3:
        raise RlpipeError(f"{where}: {LEROBOT_INFO_PATH}: video feature {key!r} has shape {list(shape)}, not height, width, channels")
    if isinstance(names, list) and len(names) == 3 and names[0] in ("channel", "channels"):
        return (shape[1], shape[2], shape[0])
    return shape


class _LerobotVideos:
    """The frames of a LeRobot dataset's video features (module doc) for its data rows, in order.

    meta/episodes gives each episode's video file and start time per feature; a frame's time in
    the file is that start plus its row's timestamp. Each feature keeps one file open and decodes
    it forward (`_VideoFile`), so memory holds a batch's frames and the decoder's own buffers."""

    def __init__(self, root: Path, info: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> None:
        key = next(iter(shapes))
        try:
            import av
        except ImportError:
            raise RlpipeError(
                f"{root.name}: feature {key!r} is a video: decoding it needs PyAV (pip install 'rlpipe[{LEROBOT_EXTRA}]'), "
                f"or leave it out: --ignore-columns {key}"
            ) from None
        self.av = av
        self.root, self.where, self.shapes = root, root.name, shapes
        self.metadata_files = sorted(root.glob(LEROBOT_EPISODES_GLOB))
        self.episodes = self._episodes()  # episode_index -> key -> (file, from_timestamp, to_timestamp)
        template = info.get("video_path")
        if not isinstance(template, str):
            raise RlpipeError(f"{self.where}: {LEROBOT_INFO_PATH} has no video_path, which names the files of video feature {key!r}")
        self.paths: dict[tuple[str, int, int], Path] = {}
        for key in shapes:
            for spans in self.episodes.values():
                chunk, file = spans[key][0]
                try:
                    self.paths[(key, chunk, file)] = root / template.format(video_key=key, chunk_index=chunk, file_index=file)
                except (KeyError, IndexError, ValueError) as exc:
                    raise RlpipeError(
                        f"{self.where}: {LEROBOT_INFO_PATH}: video_path {template!r} cannot be filled: {_reason(exc)}"
                    ) from None
        for (key, _, _), path in self.paths.items():
            if not path.is_file():
                episode = next(e for e, spans in self.episodes.items() if self.paths[(key, *spans[key][0])] == path)
                raise RlpipeError(f"{self._name(path)}: no such file (episode {episode}'s video of feature {key!r})")
        self.files = sorted(set(self.paths.values()))
        self.open: dict[str, _VideoFile] = {}

    def _name(self, path: Path) -> str:
        return f"{self.where}/{path.relative_to(self.root)}"

    def close(self) -> None:
        for opened in self.open.values():
            opened.close()
        self.open.clear()

    def _episodes(self) -> dict[int, dict[str, tuple[tuple[int, int], float, float]]]:
        """Each episode's video file (chunk, file) and its span in that file, per decoded feature."""
        import pyarrow.parquet as pq

        if not self.metadata_files:
            raise RlpipeError(f"{self.where}: no {LEROBOT_EPISODES_GLOB}, which says where each episode's video frames are")
        fields = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
        wanted = ["episode_index", *(f"videos/{key}/{field}" for key in self.shapes for field in fields)]
        episodes: dict[int, dict[str, tuple[tuple[int, int], float, float]]] = {}
        for path in self.metadata_files:
            try:
                names = pq.ParquetFile(path, pre_buffer=False).schema_arrow.names
                missing = [name for name in wanted if name not in names]
                if missing:
                    raise RlpipeError(f"{self._name(path)}: no column {missing[0]!r}")
                table = pq.read_table(path, columns=wanted)
            except (pa.ArrowException, OSError) as exc:
                raise RlpipeError(f"{self._name(path)}: cannot read it as parquet: {_reason(exc)}") from None
            for row in table.to_pylist():
                values = [row[name] for name in wanted]
                if any(value is None for value in values):
                    column = wanted[values.index(None)]
                    raise RlpipeError(f"{self._name(path)}: episode {row['episode_index']}: column {column!r} is empty (null)")
                episodes[int(row["episode_index"])] = {
                    key: (
                        (int(row[f"videos/{key}/chunk_index"]), int(row[f"videos/{key}/file_index"])),
                        float(row[f"videos/{key}/from_timestamp"]),
                        float(row[f"videos/{key}/to_timestamp"]),
                    )
                    for key in self.shapes
                }
        return episodes

    def columns(self, batch: pa.RecordBatch, first: int) -> list[pa.Array]:
        """Each decoded feature's frames for the rows of `batch` (row `first` of the data onwards),
        as fixed-size lists of height x width x 3 uint8 values."""
        needed = ("episode_index", "frame_index", "timestamp")
        missing = [name for name in needed if name not in batch.schema.names]
        if missing:
            raise RlpipeError(f"{self.where}: the data files have no {missing[0]!r} column, which finds each row's video frame")
        episode, frame, stamp = (batch.column(name).to_numpy(zero_copy_only=False) for name in needed)
        arrays = []
        for key, shape in self.shapes.items():
            pixels = np.empty((batch.num_rows, math.prod(shape)), np.uint8)
            for row in range(batch.num_rows):
                pixels[row] = self._frame(key, shape, first + row, episode[row], frame[row], stamp[row]).reshape(-1)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), pixels.shape[1]))
        return arrays

    def _frame(self, key: str, shape: tuple[int, ...], row: int, episode: Any, frame: Any, stamp: Any) -> np.ndarray:
        """The decoded frame of `key` for one data row (row, episode and frame name it in messages)."""
        spans = self.episodes.get(int(episode))
        if spans is None:
            raise RlpipeError(f"{self.where}: row {row}: episode {episode} has no row in {LEROBOT_EPISODES_GLOB}")
        (chunk, file), start, stop = spans[key]
        path = self.paths[(key, chunk, file)]
        where = f"{self._name(path)}: episode {episode}, frame {frame} (row {row})"
        wanted = start + float(stamp)
        if not wanted <= stop + LEROBOT_TOLERANCE_S:
            raise RlpipeError(f"{where}: timestamp {float(stamp):.6g} s is past the episode's video ({stop - start:.6g} s)")
        opened = self.open.get(key)
        if opened is None or opened.path != path:
            if opened is not None:
                opened.close()
            opened = self.open[key] = _VideoFile(self.av, path, self._name(path))
        found, decoded = opened.nearest(wanted, where)
        if not abs(found - wanted) < LEROBOT_TOLERANCE_S:
            raise RlpipeError(
                f"{where}: no video frame at {wanted:.6f} s (the nearest is at {found:.6f} s; LeRobot's tolerance is {LEROBOT_TOLERANCE_S} s)"
            )
        image = decoded.to_ndarray(format="rgb24")
        if image.shape != shape:
            raise RlpipeError(f"{where}: a decoded frame of shape {image.shape}, but {LEROBOT_INFO_PATH} says {shape}")
        return image


class _VideoFile:
    """A video file's first video stream decoded forward with PyAV, keeping the two frames around
    the last time asked for; an earlier time opens the file again."""

    def __init__(self, av: Any, path: Path, name: str) -> None:
        self.av, self.path, self.name = av, path, name
        self.container: Any = None
        self._start()

    def _start(self) -> None:
        self.close()
        try:
            self.container = self.av.open(str(self.path))
            streams = self.container.streams.video
            if not streams:
                raise RlpipeError(f"{self.name}: holds no video stream")
            self.frames = self.container.decode(streams[0])
        except self.av.FFmpegError as exc:
            raise RlpipeError(f"{self.name}: cannot read it as a video: {_reason(exc)}") from None
        self.before: tuple[float, Any] | None = None
        self.after: tuple[float, Any] | None = None

    def nearest(self, seconds: float, where: str) -> tuple[float, Any]:
        """The decoded frame nearest to `seconds` and its time (the later one on a tie)."""
        window = self.before or self.after
        if window is not None and seconds < window[0] - LEROBOT_TOLERANCE_S:
            self._start()
        while self.after is None or self.after[0] < seconds:
            try:
                decoded = next(self.frames, None)
            except self.av.FFmpegError as exc:
                raise RlpipeError(f"{where}: cannot decode the video: {_reason(exc)}") from None
            if decoded is None:
                break
            if decoded.time is None:
                raise RlpipeError(f"{where}: a decoded frame has no timestamp")
            self.before, self.after = self.after, (float(decoded.time), decoded)
        held = [frame for frame in (self.before, self.after) if frame is not None]
        if not held:
            raise RlpipeError(f"{where}: the video holds no frame")
        return min(reversed(held), key=lambda frame: abs(frame[0] - seconds))

    def close(self) -> None:
        if self.container is not None:
            self.container.close()
            self.container = None


# ---- arrays: .npz with D4RL's names, D4RL's HDF5, OGBench's .npz ------------------------------


def _array_source(path: Path, kind: str, given: dict[str, tuple[str, ...]]) -> _Source:
    """An array file's keys resolved like a table's columns, sliced into batches of rows."""
    where = path.name
    arrays = _read_hdf5(path, where) if kind == "d4rl" else _read_npz(path, where)
    if kind == "ogbench":
        arrays = _ogbench_transitions(arrays, where)
    names = resolve_columns(given, sorted(arrays), where)
    multi = next((role for role, columns in names.items() if len(columns) > 1), None)
    if multi is not None:
        raise RlpipeError(f"{where}: {kind} files hold one array per role; {multi} names {len(names[multi])}")
    lengths = {columns[0]: len(arrays[columns[0]]) for columns in names.values()}
    if len(set(lengths.values())) > 1:
        (short, rows), (long, most) = min(lengths.items(), key=lambda kv: kv[1]), max(lengths.items(), key=lambda kv: kv[1])
        raise RlpipeError(f"{where}: ragged arrays: {short!r} has {rows} rows, {long!r} has {most}")
    source = _Source(where, names, iter(()))
    total = next(iter(lengths.values()))
    source.batches = (
        _Rows(start, {role: _array_values(source, arrays[columns[0]], role, start) for role, columns in names.items()})
        for start in range(0, total, BATCH_ROWS)
    )
    return source


def _array_values(source: _Source, array: Any, role: str, start: int) -> np.ndarray:
    values = np.asarray(array[start : start + BATCH_ROWS])
    if values.dtype.kind not in "biuf" and role != "episode":
        raise source.fail(start, role, f"holds {values.dtype}, not numbers")
    return _as_rows(values, role)


def _as_rows(values: np.ndarray, role: str) -> np.ndarray:
    """Scalar observations and float actions as vectors of one element (Box spaces of shape (1,))."""
    vector = role in ("obs", "next_obs") or (role == "action" and values.dtype.kind == "f")
    return values.reshape(-1, 1) if vector and values.ndim == 1 else values


def _read_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise RlpipeError(f"{where}: cannot read it as .npz: {_reason(exc)}") from None


def _read_hdf5(path: Path, where: str) -> dict[str, Any]:
    """D4RL's top-level datasets, left in the file to be read a slice at a time (its infos/ and metadata/ groups are not imported)."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise RlpipeError(f"{where}: cannot read it as HDF5: {_reason(exc)}") from None
    return {key: item for key, item in handle.items() if isinstance(item, h5py.Dataset) and item.ndim >= 1}


def _ogbench_transitions(arrays: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """OGBench's layout as D4RL's: each trajectory's final-state row becomes the next_obs of the row
    before it (module doc). A file that already has next_observations is OGBench's regular layout,
    whose terminals end trajectories."""
    missing = [key for key in ("observations", "actions", "terminals") if key not in arrays]
    if missing:
        raise RlpipeError(f"{where}: no array {missing[0]!r} (OGBench's files hold observations, actions and terminals)")
    obs, ends = arrays["observations"], np.asarray(arrays["terminals"]) > 0
    rewards = arrays.get("rewards", np.zeros(len(obs), np.float32))
    if "next_observations" in arrays:
        return {**arrays, "rewards": rewards, "terminals": np.zeros(len(obs), bool), "timeouts": ends}
    for key in ("actions", "terminals", "valids", "rewards", "terminations"):
        if len(arrays.get(key, obs)) != len(obs):
            raise RlpipeError(f"{where}: ragged arrays: {key!r} has {len(arrays[key])} rows, 'observations' has {len(obs)}")
    valid = np.asarray(arrays["valids"]) > 0 if "valids" in arrays else ~ends
    kept = np.flatnonzero(valid[:-1])  # the last row has no next row: dropped
    following = np.r_[valid[1:], False]
    terminated = np.asarray(arrays.get("terminations", np.zeros(len(obs), bool)))[kept]  # checked as flags with the other roles
    return {
        "observations": obs[kept],
        "actions": arrays["actions"][kept],
        "rewards": rewards[kept],
        "next_observations": obs[kept + 1],
        "terminals": terminated,
        "timeouts": (~following[kept] | (kept + 1 == len(obs) - 1)) & (terminated == 0),
    }


# ---- episodes --------------------------------------------------------------------------------


class _Episodes:
    """Cuts a source's rows into whole episodes and turns them into the writer's rows (module doc).

    `feed` takes each batch and returns the rows of the episodes it completes (the one it
    ends in waits for the next batch); `finish` returns the last episode's.
    """

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.by_key = "episode" in source.names
        self.derive_next = "next_obs" not in source.names
        self.open: _Rows | None = None
        self.seen: set[Any] = set()
        self.next_id = 0
        self.dropped = 0

    def feed(self, batch: _Rows) -> dict[str, np.ndarray] | None:
        rows = batch if self.open is None else self.open.then(batch)
        cut = self._last_start(rows)
        self.open = rows.part(cut, len(rows))
        return self._whole(rows.part(0, cut)) if cut else None

    def finish(self) -> dict[str, np.ndarray] | None:
        rows, self.open = self.open, None
        return self._whole(rows) if rows is not None and len(rows) else None

    def _last_start(self, rows: _Rows) -> int:
        """Where the episode the rows end in starts."""
        if self.by_key:
            key = rows.columns["episode"]
            changes = np.flatnonzero(key[1:] != key[:-1])
            return int(changes[-1]) + 1 if len(changes) else 0
        done = np.flatnonzero(rows.columns["terminated"] | rows.columns["truncated"])
        return int(done[-1]) + 1 if len(done) else 0

    def _whole(self, rows: _Rows) -> dict[str, np.ndarray] | None:
        """Whole episodes' rows checked, numbered and with next_obs, as the writer takes them."""
        columns = rows.columns
        count = len(rows)
        if self.by_key:
            key = columns["episode"]
            starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
            self._check_keys(rows, starts)
        else:
            starts = np.flatnonzero(np.r_[True, (columns["terminated"] | columns["truncated"])[:-1]])
        last = np.zeros(count, bool)
        last[np.r_[starts[1:], count] - 1] = True
        if "step" in columns:
            self._check_steps(rows, starts)
        terminated, truncated = columns["terminated"], columns["truncated"] | (last & ~columns["terminated"])
        early = np.flatnonzero((terminated | truncated) & ~last)
        if len(early):
            role = "terminated" if terminated[early[0]] else "truncated"
            raise self.source.fail(rows.first + int(early[0]), role, "is set before the last row of its episode")
        obs = columns["obs"]
        if self.derive_next:
            next_obs = np.concatenate([obs[1:], obs[-1:]])
            next_obs[last] = obs[last]  # its own obs: kept on terminated last rows only
            keep = ~last | terminated
            before = np.flatnonzero(~keep)
            before = before[before > 0] - 1
            truncated = truncated.copy()
            truncated[before[~last[before]]] = True  # the row before a dropped one now ends its episode
        else:
            next_obs, keep = columns["next_obs"], np.ones(count, bool)
        self.dropped += int(count - keep.sum())
        number = np.cumsum(np.r_[True, (last[:-1])]) - 1  # episode index of each row
        kept_numbers = number[keep]
        if len(kept_numbers) == 0:
            return None
        renumbered = np.cumsum(np.r_[True, kept_numbers[1:] != kept_numbers[:-1]]) - 1
        first_of_episode = np.flatnonzero(np.r_[True, renumbered[1:] != renumbered[:-1]])
        step = np.arange(len(renumbered)) - first_of_episode[renumbered]
        rows_out = {
            "episode_id": self.next_id + renumbered.astype(np.int64),
            "step": step.astype(np.int32),
            "obs": obs[keep],
            "action": columns["action"][keep],
            "reward": columns["reward"][keep].astype(np.float32),
            "next_obs": next_obs[keep],
            "terminated": terminated[keep],
            "truncated": truncated[keep],
        }
        self.next_id += int(renumbered[-1]) + 1
        return rows_out

    def _check_keys(self, rows: _Rows, starts: np.ndarray) -> None:
        """An episode's rows are together: its key never returns after another episode's rows."""
        for start, key in zip(starts.tolist(), rows.columns["episode"][starts].tolist()):
            if key in self.seen:
                raise self.source.fail(
                    rows.first + start, "episode", f"episode {key!r} continues after other episodes' rows (rows must be grouped by episode)"
                )
            self.seen.add(key)

    def _check_steps(self, rows: _Rows, starts: np.ndarray) -> None:
        step = rows.columns["step"]
        inside = np.ones(len(step), bool)
        inside[starts] = False
        bad = np.flatnonzero(inside[1:] & (np.diff(step) != 1)) + 1
        if len(bad):
            row = int(bad[0])
            raise self.source.fail(
                rows.first + row, "step", f"step {step[row]} follows step {step[row - 1]} (an episode's steps count up by 1)"
            )


# ---- checks of each batch --------------------------------------------------------------------


class _Batch:
    """The checks of each batch before it is cut into episodes: the same dtype and shape per role
    as the first batch, 0/1 flags, finite floats and actions inside the declared space."""

    def __init__(self, source: _Source, first: _Rows, action_space: gym.Space | None, bounded: bool) -> None:
        self.source = source
        self.layout = {role: (values.dtype, values.shape[1:]) for role, values in first.columns.items()}
        self.action_space = action_space
        self.bounded = bounded  # Box bounds are checked for a declared space only (datasets may hold actions an env clips)

    def check(self, rows: _Rows) -> _Rows:
        columns = dict(rows.columns)
        for role, values in rows.columns.items():
            if (values.dtype, values.shape[1:]) != self.layout[role] and not (role == "episode" and values.dtype.kind in "OU"):
                dtype, shape = self.layout[role]
                raise self.source.fail(rows.first, role, f"changes from {dtype} {shape} to {values.dtype} {values.shape[1:]}")
        for role in ("terminated", "truncated"):
            columns[role] = self._flags(rows, role)
        if not non_finite_allowed():
            for role in FLOAT_ROLES:
                self._finite(rows, role)
        self._in_space(rows)
        return replace(rows, columns=columns)

    def _flags(self, rows: _Rows, role: str) -> np.ndarray:
        if role not in rows.columns:
            return np.zeros(len(rows), bool)
        values = rows.columns[role]
        bad = np.flatnonzero((values != 0) & (values != 1))
        if len(bad):
            raise self.source.fail(rows.first + int(bad[0]), role, f"holds {values[bad[0]]}, not 0 or 1")
        return values.astype(bool)

    def _finite(self, rows: _Rows, role: str) -> None:
        values = rows.columns.get(role)
        if values is None or values.dtype.kind != "f" or np.isfinite(values).all():
            return
        bad = ~np.isfinite(values.reshape(len(values), -1))
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        column = int(np.flatnonzero(bad[row])[0])
        raise self.source.fail(
            rows.first + row,
            role,
            f"holds {values.reshape(len(values), -1)[row, column]} (set {ALLOW_NONFINITE_ENV}=1 to accept it)",
            column,
        )

    def _in_space(self, rows: _Rows) -> None:
        space, action = self.action_space, rows.columns["action"]
        if isinstance(space, gym.spaces.Discrete):
            if action.dtype.kind not in "iu" or action.ndim != 1:
                raise self.source.fail(rows.first, "action", f"holds {action.dtype} {action.shape[1:]} values; {space} takes integers")
            outside = (action < space.start) | (action >= space.start + space.n)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            outside = ((action < space.start) | (action >= space.start + space.nvec)).reshape(len(action), -1).any(axis=1)
        elif isinstance(space, gym.spaces.Box) and action.shape[1:] != space.shape:
            raise self.source.fail(rows.first, "action", f"actions of shape {action.shape[1:]} do not fit {space}")
        elif isinstance(space, gym.spaces.Box) and self.bounded:
            flat = action.reshape(len(action), -1)
            outside = ((flat < space.low.reshape(-1)) | (flat > space.high.reshape(-1))).any(axis=1)
        else:
            return
        if outside.any():
            row = int(np.flatnonzero(outside)[0])
            raise self.source.fail(rows.first + row, "action", f"action {action[row].tolist()} is outside {space}")


# ---- spaces ----------------------------------------------------------------------------------


def _observation_space(first: _Rows, env_space: gym.Space | None, where: str) -> gym.Space:
    obs = first.columns["obs"]
    if env_space is not None:
        if not isinstance(env_space, gym.spaces.Box) or env_space.shape != obs.shape[1:]:
            raise RlpipeError(f"{where}: observations of shape {obs.shape[1:]} do not fit the env's {env_space}")
        return env_space
    if obs.dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, obs.shape[1:], obs.dtype)
    if obs.dtype.kind in "iu":
        bounds = np.iinfo(obs.dtype)
        return gym.spaces.Box(bounds.min, bounds.max, obs.shape[1:], obs.dtype)
    raise RlpipeError(f"{where}: observations of dtype {obs.dtype} are not numbers")


def _declared_action_space(declared: tuple, first: _Rows, where: str) -> gym.Space:
    if declared[0] == "discrete":
        return gym.spaces.Discrete(int(declared[1]))
    action = first.columns["action"]
    dtype = action.dtype if action.dtype.kind == "f" else np.dtype(np.float32)
    return gym.spaces.Box(float(declared[1]), float(declared[2]), action.shape[1:], dtype)


class _ActionRange:
    """The actions' per-dimension min and max, for a space inferred from the data."""

    def __init__(self) -> None:
        self.low: np.ndarray | None = None
        self.high: np.ndarray | None = None

    def add(self, action: np.ndarray) -> None:
        low, high = action.min(axis=0), action.max(axis=0)
        self.low = low if self.low is None else np.minimum(self.low, low)
        self.high = high if self.high is None else np.maximum(self.high, high)

    def space(self, dtype: np.dtype, where: str) -> gym.Space:
        assert self.low is not None and self.high is not None  # a dataset is never empty here
        if dtype.kind == "f":
            return gym.spaces.Box(self.low, self.high, dtype=dtype)
        if np.any(self.low < 0):
            raise RlpipeError(f"{where}: integer actions below 0: declare their space with --action-space discrete:N or box:LOW,HIGH")
        if self.high.ndim == 0:
            return gym.spaces.Discrete(int(self.high) + 1)
        return gym.spaces.MultiDiscrete(self.high.astype(np.int64) + 1)


def _provisional_action_space(first: _Rows) -> gym.Space:
    """A space of the actions' dtype and shape (all the Arrow schema depends on), replaced by
    the inferred one once every action was seen."""
    action = first.columns["action"]
    if action.dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, action.shape[1:], action.dtype)
    if action.dtype.kind in "iu":
        return gym.spaces.Discrete(2**62) if action.ndim == 1 else gym.spaces.MultiDiscrete(np.full(action.shape[1:], 2**62))
    raise RlpipeError(f"actions of dtype {action.dtype} are not numbers")


# ---- the import ------------------------------------------------------------------------------


def import_file(
    path: str | Path,
    name: str,
    *,
    source_format: str,
    columns: dict[str, tuple[str, ...]] | None = None,
    ignore_columns: Sequence[str] = (),
    action_space: str | None = None,
    env_id: str | None = None,
    store: Any = None,
    fmt: str = "both",
    force: bool = False,
) -> Path:
    """Import the file `path` of `source_format` (not minari; lerobot: a LeRobot dataset's
    directory) as dataset `name`; returns its path.

    `columns` maps roles (obs, next_obs, action, reward, terminated, truncated, episode, step)
    to source column names; `ignore_columns` are table columns left out on purpose."""
    check_name(name)  # before any work
    if source_format not in SOURCE_FORMATS[1:]:
        raise RlpipeError(f"unknown source format {source_format!r}: choose one of {', '.join(SOURCE_FORMATS)}")
    declared = parse_action_space(action_space) if action_space else None
    path = Path(path)
    if source_format == "lerobot" and not path.is_dir():
        raise RlpipeError(f"{path}: no such directory (--from lerobot reads a LeRobot dataset's directory)")
    if source_format != "lerobot" and not path.is_file():
        raise RlpipeError(f"{path}: no such file")
    given = columns or {}
    if source_format == "lerobot":
        source = _lerobot_source(path, given, tuple(ignore_columns))
    elif source_format in TABLE_FORMATS:
        source = _table_source(path, source_format, given, tuple(ignore_columns), declared)
    else:
        source = _array_source(path, source_format, given)
    first = next(source.batches, None)
    if first is None:
        raise RlpipeError(f"{source.where}: holds no rows")
    recorded = _recorded_dataset(source) if not (env_id or declared) else None  # an rlpipe export: its spaces and env back
    env_spec = None
    if recorded is not None:
        recorded_observations, recorded_actions, env_id, env_spec = recorded
        env_spaces: tuple[gym.Space, gym.Space] | None = (recorded_observations, recorded_actions)
    else:
        env_spaces = _env_spaces(env_id) if env_id else None
    observation_space = _observation_space(first, env_spaces[0] if env_spaces else None, source.where)
    if declared:
        chosen: gym.Space | None = _declared_action_space(declared, first, source.where)
    else:
        chosen = env_spaces[1] if env_spaces else None
    checks = _Batch(source, first, chosen, bounded=declared is not None)
    episodes = _Episodes(source)
    action_range = _ActionRange()
    rows_read = 0
    with DatasetWriter(
        name,
        observation_space,
        chosen or _provisional_action_space(first),
        env_id=env_id,
        env_spec=env_spec,
        store=store,
        fmt=fmt,
        force=force,
    ) as writer:
        batch: _Rows | None = first
        while batch is not None:
            rows_read += len(batch)
            _write(writer, episodes.feed(checks.check(batch)), action_range)
            batch = next(source.batches, None)
        _write(writer, episodes.finish(), action_range)
        if writer.total_steps == 0:
            raise RlpipeError(f"{source.where}: no transition is left once each episode's last row without a next observation is dropped")
        if chosen is None:  # the writer reads the spaces again only when it writes metadata
            writer.action_space = action_range.space(first.columns["action"].dtype, source.where)
        size, digest = _digest(path, source.inputs)
        producer = {
            "algorithm": "unknown",
            "imported_from": f"{source_format}:{path.name}",
            "source": {
                "format": source_format,
                "file": path.name,
                "bytes": size,
                "sha256": digest,
                "columns": {role: list(names) for role, names in source.names.items()},
                "rows": rows_read,
                "dropped_rows": episodes.dropped,
                **({"action_space": action_space} if action_space else {}),
            },
            "checkpoint_sha256": None,
        }
        return writer.finalize(producer)


def _digest(path: Path, inputs: list[Path] | None = None) -> tuple[int, str]:
    """A source's bytes and sha256: a file's own; for a LeRobot directory, its info.json's and
    data files' bytes (and, where videos were decoded, its episodes' and video files') and the
    sha256 of their `sha256  path` lines (as sha256sum prints them)."""
    if path.is_file():
        return path.stat().st_size, sha256_file(path)
    files = inputs or [path / LEROBOT_INFO_PATH, *_lerobot_data_files(path)]
    lines = "".join(f"{sha256_file(file)}  {file.relative_to(path)}\n" for file in files)
    return sum(file.stat().st_size for file in files), hashlib.sha256(lines.encode()).hexdigest()


def _recorded_dataset(source: _Source) -> tuple[gym.Space, gym.Space, str | None, str | None] | None:
    """The observation and action spaces, env id and env spec an rlpipe Parquet export recorded
    (None for any other file). The spec is checked where an env is built from it (trust model)."""
    from rlpipe.envs.spaces import space_from_json

    if source.recorded is None:
        return None
    where = f"{source.where} {EXPORT_METADATA_KEY!r}"
    spaces = [space_from_json(source.recorded.get(key), f"{where} {key!r}") for key in ("observation_space", "action_space")]
    env_id, env_spec = source.recorded.get("env_id"), source.recorded.get("env_spec")
    for key, value in (("env_id", env_id), ("env_spec", env_spec)):
        if value is not None and not isinstance(value, str):
            raise RlpipeError(f"{where} {key!r} is not a string or null")
    return spaces[0], spaces[1], env_id, env_spec


def _write(writer: DatasetWriter, rows: dict[str, np.ndarray] | None, action_range: _ActionRange) -> None:
    if rows is not None and len(rows["reward"]):
        action_range.add(rows["action"])
        writer.write(dict(rows))


def _env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    from rlpipe.envs import env_spaces

    try:
        return env_spaces(env_id)
    except gym.error.Error as exc:
        raise RlpipeError(f"--env {env_id}: {exc}") from None


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
