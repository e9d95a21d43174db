"""Streaming, atomic dataset writer.

Rows arrive in batches of whole episodes, sorted by (episode_id, step). They are buffered up
to `shard_bytes` and written as one Arrow record batch per shard, so memory stays bounded and
each shard memory-maps into contiguous arrays. Everything is written into a hidden temporary
directory that is renamed into place only after metadata.json (with the content hash) is
complete: a killed or failed run never leaves a dataset that looks complete. The name is
locked while the writer lives, and `--force` replaces the old dataset so that a crash at any
moment leaves the old or the new one (`rlpipe.storage.atomic`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa
from minari.serialization import serialize_space

from rlpipe.datasets import hdf5
from rlpipe.datasets.codec import FRAME_CODEC, chained_rows, compressible, encode_frames
from rlpipe.datasets.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INFO_COLUMNS,
    PLAIN_FORMAT_VERSION,
    SCALAR_COLUMNS,
    Columnar,
    check_finite,
    concat_columnar,
    num_rows,
    step_schema,
    to_arrow,
)
from rlpipe.datasets.store import (
    METADATA_FILE,
    STEPS_DIR,
    check_name,
    check_new_name,
    hash_files,
    is_dataset_dir,
    store_root,
)
from rlpipe.errors import RlpipeError
from rlpipe.storage.atomic import StagedDirectory, commit_group, json_text
from rlpipe.version import __version__

FORMATS = ("arrow", "hdf5", "both")
KINDS = ("episodes", "transitions")  # what the rows are; docs/dataset-format.md gives each kind's invariant
DEFAULT_SHARD_BYTES = 256 << 20


def formats_for(fmt: str) -> tuple[str, ...]:
    """Expand a `--format` value into the formats to write."""
    if fmt not in FORMATS:
        raise RlpipeError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return ("arrow", "hdf5") if fmt == "both" else (fmt,)


def _nbytes(values: Columnar) -> int:
    return sum(_nbytes(v) for v in values.values()) if isinstance(values, dict) else np.asarray(values).nbytes


class DatasetWriter:
    """Write a dataset `name` into the store; use as a context manager so failures clean up.

    Args:
        name: dataset name (directory under the store).
        observation_space, action_space: the env's single-agent spaces.
        env_id: gymnasium id of the env that produced the data (None for synthetic data).
        env_spec: that env's `EnvSpec.to_json()` as it was when the data was made (an import
            keeps its source's); default: the locally registered spec of `env_id`.
        store: store directory (see `store_root`).
        fmt: "arrow", "hdf5" or "both". Arrow shards are always written (they are the
            source of truth); "hdf5" adds Minari's HDF5 layout.
        force: replace an existing dataset of the same name on success.
        multi_agent: add an `agent` column (Arrow only; Minari has no multi-agent layout).
        info_space: a Dict of the env info keys stored as `info`/`next_info` columns (None: none).
        kind: "episodes" (whole trajectories) or "transitions" (e.g. relabelled copies: rows
            that need not form trajectories; Arrow only, no episode statistics).
        shard_bytes: approximate size of one Arrow shard, counting frames uncompressed (so
            a reader's decoded shard stays that size).
        compress_frames: store uint8 image observations compressed, next_obs only where it
            is not the next row's obs (`rlpipe.datasets.codec`); False writes them as
            fixed-size lists, the layout of format version 1.
    """

    def __init__(
        self,
        name: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        env_id: str | None,
        env_spec: str | None = None,
        store: str | os.PathLike | None = None,
        fmt: str = "both",
        force: bool = False,
        multi_agent: bool = False,
        info_space: gym.spaces.Dict | None = None,
        kind: str = "episodes",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        compress_frames: bool = True,
    ) -> None:
        self.name = check_name(name)
        self.formats = formats_for(fmt)
        if kind not in KINDS:
            raise RlpipeError(f"unknown dataset kind {kind!r}: choose one of {', '.join(KINDS)}")
        if kind == "transitions" and "hdf5" in self.formats:
            raise RlpipeError("transition datasets are Arrow-only (Minari's layout holds trajectories): use --format arrow")
        self.kind = kind
        if multi_agent and "hdf5" in self.formats:
            raise RlpipeError("multi-agent datasets are Arrow-only (Minari has no multi-agent layout): use --format arrow")
        self.root = store_root(store)
        self.final_path = self.root / self.name
        self.force = force
        self.observation_space = observation_space
        self.action_space = action_space
        self.env_id = env_id
        self.env_spec = env_spec
        self.multi_agent = multi_agent
        self.info_space = info_space
        self.frame_codec = FRAME_CODEC if compress_frames and compressible(observation_space) else None
        self.schema = step_schema(observation_space, action_space, multi_agent, info_space, self.frame_codec)
        self.shard_bytes = shard_bytes
        self._staging = StagedDirectory(self.final_path, f"dataset {self.name!r}", is_dataset_dir, self._check_target)
        self.temp_path = self._staging.path
        try:
            (self.temp_path / STEPS_DIR).mkdir()
        except OSError:
            self._staging.abort()
            raise
        self._pending: list[dict[str, Columnar]] = []
        self._pending_bytes = 0
        self._shards: list[str] = []
        self._episode_returns: list[np.ndarray] = []
        self._episode_lengths: list[np.ndarray] = []
        self.total_steps = 0
        self._last_episode = -1
        self._closed = False

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._closed:
            self.abort()
        if isinstance(exc, OSError):  # a full disk, a vanished directory: one line, nothing left
            raise RlpipeError(f"writing dataset {self.name!r} failed: {exc.strerror or exc}") from None

    def _check_target(self, final: Path) -> None:
        """Run under the name's lock: may the dataset be written under this name?"""
        if final.is_symlink():
            raise RlpipeError(f"{final} is a symbolic link, not a dataset directory; remove it or choose another name")
        if os.path.lexists(final) and not self.force:
            raise RlpipeError(f"dataset {self.name!r} already exists in {self.root} (use --force to replace it)")
        if os.path.lexists(final) and not final.is_dir():
            raise RlpipeError(f"{final} exists and is not a dataset directory")
        check_new_name(self.root, self.name)

    def write(self, rows: dict[str, Columnar]) -> None:
        """Append rows of whole episodes, sorted by (episode_id, step), with ids above earlier ones."""
        count = num_rows(rows["reward"])
        if count == 0:
            return
        episode_id = np.asarray(rows["episode_id"])
        if episode_id[0] <= self._last_episode or np.any(np.diff(episode_id) < 0):
            raise ValueError("rows must arrive as whole episodes sorted by increasing episode_id")
        check_finite(rows, f"dataset {self.name!r}")
        self._last_episode = int(episode_id[-1])
        starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
        self._episode_returns.append(np.add.reduceat(np.asarray(rows["reward"], dtype=np.float64), starts))
        self._episode_lengths.append(np.diff(np.r_[starts, count]))
        self._pending.append(rows)
        self._pending_bytes += sum(_nbytes(v) for v in rows.values())
        self.total_steps += count
        if self._pending_bytes >= self.shard_bytes:
            self._flush_shard()

    def adopt_shard(self, shard: Path) -> None:
        """Take over a finished Arrow shard of this dataset's schema (e.g. written by a
        collection task under ``temp_path``) as the next shard: its episode ids are renumbered
        to follow the rows written so far, and the source file is removed."""
        self._flush_shard()  # keep rows in arrival order
        with pa.memory_map(str(shard)) as source:
            table = pa.ipc.open_file(source).read_all()
        if table.schema != self.schema:
            raise RlpipeError(f"shard {shard} does not have the schema of dataset {self.name!r}")
        episode_id = table.column("episode_id").to_numpy()
        if len(episode_id) == 0:
            shard.unlink()
            return
        starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
        renumbered = self._last_episode + 1 + np.cumsum(np.r_[False, episode_id[1:] != episode_id[:-1]])
        field = self.schema.field("episode_id")
        table = table.set_column(self.schema.get_field_index("episode_id"), field, pa.array(renumbered, field.type))
        self._last_episode = int(renumbered[-1])
        self._episode_returns.append(np.add.reduceat(table.column("reward").to_numpy().astype(np.float64), starts))
        self._episode_lengths.append(np.diff(np.r_[starts, len(episode_id)]))
        self.total_steps += len(episode_id)
        rel = f"{STEPS_DIR}/shard-{len(self._shards):05d}.arrow"
        with pa.OSFile(str(self.temp_path / rel), "wb") as sink, pa.ipc.new_file(sink, self.schema) as ipc:
            for batch in table.combine_chunks().to_batches(max_chunksize=None):
                ipc.write_batch(batch)
        self._shards.append(rel)
        shard.unlink()

    def _flush_shard(self) -> None:
        if not self._pending:
            return
        rows = {key: concat_columnar([part[key] for part in self._pending]) for key in self._pending[0]}
        self._pending, self._pending_bytes = [], 0
        arrays = []
        for field in self.schema:
            if field.name in ("obs", "next_obs") and self.frame_codec:
                frames = cast("dict[str, np.ndarray]", rows)  # compressed image observations are arrays, never dicts
                skip = chained_rows(frames["obs"], frames["next_obs"], frames["episode_id"]) if field.name == "next_obs" else None
                arrays.append(encode_frames(frames[field.name], skip))
            elif field.name in ("obs", "next_obs"):
                arrays.append(to_arrow(rows[field.name], self.observation_space))
            elif field.name == "action":
                arrays.append(to_arrow(rows[field.name], self.action_space))
            elif field.name in INFO_COLUMNS:
                arrays.append(to_arrow(rows[field.name], cast(gym.spaces.Dict, self.info_space)))  # the schema has info columns
            elif field.name == "agent":
                arrays.append(pa.array(np.asarray(rows["agent"], dtype=str), type=pa.string()))
            else:
                dtype = SCALAR_COLUMNS[field.name].to_pandas_dtype()
                arrays.append(pa.array(np.ascontiguousarray(rows[field.name], dtype=dtype)))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        rel = f"{STEPS_DIR}/shard-{len(self._shards):05d}.arrow"
        with pa.OSFile(str(self.temp_path / rel), "wb") as sink, pa.ipc.new_file(sink, self.schema) as ipc:
            ipc.write_batch(batch)
        self._shards.append(rel)

    def finalize(self, producer: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
        """Write the last shard, the HDF5 copy and metadata.json, then move the dataset into place."""
        self.prepare(producer, extra)
        self._staging.commit()
        self._closed = True
        return self.final_path

    def prepare(self, producer: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Write the last shard, the HDF5 copy and metadata.json, still under the temporary
        name: `finalize` without the publish (`publish_together` publishes several)."""
        if self.total_steps == 0:
            raise RlpipeError(f"dataset {self.name!r} would be empty: no complete episode was collected")
        self._flush_shard()
        files = list(self._shards)
        if "hdf5" in self.formats:
            files += hdf5.write_minari_layout(
                self.temp_path,
                [self.temp_path / rel for rel in self._shards],
                self._minari_metadata(producer, extra or {}),
                self.info_space,
                (extra or {}).get("episode_seeds"),
            )
        file_hashes, content_hash = hash_files(self.temp_path, files)
        returns = np.concatenate(self._episode_returns)
        lengths = np.concatenate(self._episode_lengths)
        metadata = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION if self.frame_codec else PLAIN_FORMAT_VERSION,
            "rlpipe_version": __version__,
            "name": self.name,
            "env_id": self.env_id,
            "env_spec": self._env_spec_json(),
            "observation_space": serialize_space(self.observation_space),
            "action_space": serialize_space(self.action_space),
            "multi_agent": self.multi_agent,
            **({} if self.info_space is None else {"info_space": serialize_space(self.info_space)}),
            **({} if self.frame_codec is None else {"frame_codec": self.frame_codec}),
            "producer": producer,
            "total_episodes": int(len(returns)),
            "total_steps": int(self.total_steps),
            "kind": self.kind,
            **({"episode_return": _stats(returns), "episode_length": _stats(lengths)} if self.kind == "episodes" else {}),
            "formats": list(self.formats),
            "files": file_hashes,
            "content_hash": content_hash,
            **(extra or {}),
        }
        (self.temp_path / METADATA_FILE).write_text(json_text(metadata))
        self.metadata = metadata

    def abort(self) -> None:
        """Delete everything written so far; the store is left as it was."""
        self._staging.abort()
        self._closed = True

    def _env_spec_json(self) -> str | None:
        if self.env_spec is not None or self.env_id is None:
            return self.env_spec
        try:
            return gym.spec(self.env_id).to_json()
        except (gym.error.Error, TypeError, ValueError):
            return None

    def _minari_metadata(self, producer: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return hdf5.minari_metadata(
            self.name,
            {
                **extra,
                "producer": producer,
                "observation_space": serialize_space(self.observation_space),
                "action_space": serialize_space(self.action_space),
                "env_spec": self._env_spec_json(),
            },
        )


def _stats(values: np.ndarray) -> dict[str, float | None]:
    """Mean, std, min and max; null where non-finite data (an opt-in) makes them NaN."""
    stats = {"mean": values.mean(), "std": values.std(), "min": values.min(), "max": values.max()}
    return {key: float(value) if np.isfinite(value) else None for key, value in stats.items()}


def publish_together(writers: Sequence[DatasetWriter]) -> list[Path]:
    """Publish prepared writers (`DatasetWriter.prepare`) of one store as a group: a crash at
    any moment leaves all of them published or none (`rlpipe.storage.atomic.commit_group`)."""
    paths = commit_group([writer._staging for writer in writers])
    for writer in writers:
        writer._closed = True
    return paths


def write_rows(
    name: str,
    batches: Iterable[dict[str, Columnar]],
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    env_id: str | None,
    producer: dict[str, Any],
    extra: dict[str, Any] | None = None,
    **writer_options: Any,
) -> Path:
    """Write an iterable of row batches as a complete dataset (a convenience over DatasetWriter)."""
    with DatasetWriter(name, observation_space, action_space, env_id=env_id, **writer_options) as writer:
        for rows in batches:
            writer.write(rows)
        return writer.finalize(producer, extra)
