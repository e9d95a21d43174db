"""Loading a dataset for training: memory-mapped Arrow shards into contiguous numpy arrays.
Torch-free; the torch sampler over these arrays is `rlpipe.training.sampler.TransitionSampler`.

Loading verifies what it reads: each shard's sha256 against metadata.json (computed once
and cached in `<store>/.verified/<name>.json` by inode, size, mtime and ctime, so a changed
file is hashed again; the cache is signed with the user's key, `rlpipe.storage.files.user_key`,
since anyone who can write the store can write it too), then the checks of `rlpipe.datasets.checks` (schema, nulls, the rows'
invariant, finite floats unless the user opts in, actions in the space, chained next_obs,
the counts of metadata), the same code `datasets validate` runs. Compressed image columns
(`rlpipe.datasets.codec`) are decoded, null next_obs rows filled from the next row's obs, so
every reader gets plain arrays.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa

from rlpipe.datasets.checks import RowChecks, batch_problems
from rlpipe.datasets.codec import CorruptFrame, fill_chained, is_frame_column
from rlpipe.datasets.schema import INFO_COLUMNS, Columnar, concat_columnar, from_arrow, scalar_from_arrow, step_schema
from rlpipe.datasets.store import METADATA_FILE, DatasetInfo, open_dataset
from rlpipe.envs.spaces import space_from_json
from rlpipe.errors import RlpipeError
from rlpipe.storage.files import MAX_JSON_BYTES, atomic_write_text, read_limited, sha256_file, user_key


@dataclass
class TransitionArrays:
    """A whole dataset as contiguous arrays, one row per transition (Dict observations as dicts)."""

    obs: Columnar
    action: Columnar
    reward: np.ndarray
    next_obs: Columnar
    terminated: np.ndarray
    truncated: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    agent: np.ndarray | None = None
    info: Columnar | None = None  # selected env info keys (metadata `info_space`), with obs
    next_info: Columnar | None = None  # ... and with next_obs

    def __len__(self) -> int:
        return len(self.reward)

    def episode_starts(self) -> np.ndarray:
        """Row index where each episode begins (rows are sorted by episode_id, step)."""
        ids = self.episode_id
        return np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])

    def episode_returns(self) -> np.ndarray:
        """The undiscounted return of each episode, in episode order."""
        return np.add.reduceat(self.reward.astype(np.float64), self.episode_starts())


VERIFIED_DIR = ".verified"


class ShardVerifier:
    """Checks a dataset's shards against metadata.json, hashing each file only when its
    (inode, size, mtime, ctime) changed since it last matched, and running the row checks
    (`rlpipe.datasets.checks`) on what `read` returns, in full only for a shard that has not
    passed them since (the cache remembers the checks' fingerprint beside the hash);
    `finish()` checks the counts once every shard was read. `digest()` is the sha256 of the
    shards as read, which provenance records."""

    def __init__(self, info: DatasetInfo) -> None:
        self.info = info
        self.cache_path = info.path.parent / VERIFIED_DIR / f"{info.path.name}.json"
        self._user_key = user_key()
        self.cache = self._load_cache()
        self._changed = False
        self.info_space = info_space_of(info)
        self.schema = step_schema(
            info.observation_space, info.action_space, info.metadata["multi_agent"], self.info_space, info.frame_codec
        )
        self.checks = RowChecks(info)

    def _load_cache(self) -> dict:
        """The cache's entries when the user's key signed them for this dataset; else none (the
        shards are hashed again). A link, a special file or an oversized cache is missing too."""
        if self._user_key is None or self.cache_path.parent.is_symlink():
            return {}
        try:
            signed = json.loads(read_limited(self.cache_path, MAX_JSON_BYTES))
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(signed, dict) or not isinstance(signed.get("entries"), dict) or not isinstance(signed.get("mac"), str):
            return {}
        return signed["entries"] if hmac.compare_digest(signed["mac"], self._mac(signed["entries"])) else {}

    def _mac(self, entries: dict) -> str:
        """The cache's signature: HMAC-SHA256 under the user's key over the dataset's real path and the entries."""
        assert self._user_key is not None
        message = f"{os.path.realpath(self.info.path)}\n{json.dumps(entries, sort_keys=True)}".encode()
        return hmac.new(self._user_key, message, hashlib.sha256).hexdigest()

    def _file_key(self, rel: str) -> list[int | str]:
        stat = (self.info.path / rel).stat()
        return [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, self.info.metadata["files"][rel]["sha256"]]

    def check_hash(self, rel: str) -> None:
        """Raise unless the file's bytes have the recorded sha256 (trusting a cache hit)."""
        path = self.info.path / rel
        if not path.is_file():
            raise RlpipeError(f"dataset {self.info.name!r} is missing {rel} (run `rlpipe datasets validate`)")
        entry = self.cache.get(rel)
        key = self._file_key(rel)
        if isinstance(entry, dict) and entry.get("key") == key:
            return
        if sha256_file(path) != self.info.metadata["files"][rel]["sha256"]:
            raise RlpipeError(
                f"corrupted shard {path}: its sha256 differs from metadata (modified or damaged; run `rlpipe datasets validate`)"
            )
        self.cache[rel] = {"key": key}
        self._changed = True

    def read(self, rel: str, names: tuple[str, ...] | None = None) -> dict[str, Columnar]:
        """One verified shard's columns (see `read_shard`); with `names` (episode_id among
        them), only those once the shard passed the checks before, so its frames are not decoded."""
        self.check_hash(rel)
        entry = self.cache[rel]
        checked = entry.get("checked") == self.checks.fingerprint
        columns, problems = self.check(rel, checked, names if checked else None)
        self._refuse(problems)
        if not checked:
            entry["checked"] = self.checks.fingerprint
            self._changed = True
        return columns

    def check(self, rel: str, checked: bool = False, names: tuple[str, ...] | None = None) -> tuple[dict[str, Columnar], list[str]]:
        """One shard's columns (all, or `names`) and the problems the checks find in them (its
        bytes unhashed; an unreadable file is an RlpipeError). `checked`: see `RowChecks.shard`."""
        batch = _read_shard(self.info.path / rel)
        problems = batch_problems(batch, self.schema)
        if problems:
            return {}, [f"{rel} {problem}" for problem in problems]
        try:
            columns = _columns(batch, self.info.observation_space, self.info.action_space, self.info_space, names)
        except CorruptFrame as exc:
            return {}, [f"{rel} {exc}"]
        return columns, self.checks.shard(columns, checked)

    def finish(self) -> None:
        """After the last shard: check the counts and remember the verified hashes."""
        if not self.info.shard_rels:
            raise RlpipeError(f"dataset {self.info.name!r} has no step shards")
        self._refuse(self.checks.totals())
        self.save()

    def _refuse(self, problems: list[str]) -> None:
        if problems:
            raise RlpipeError(f"dataset {self.info.name!r} is corrupted: {problems[0]} (run `rlpipe datasets validate`)")

    def digest(self) -> str:
        """sha256 over `"<path>:<sha256>\n"` of the shards, as verified."""
        lines = "".join(f"{rel}:{self.info.metadata['files'][rel]['sha256']}\n" for rel in self.info.shard_rels)
        return hashlib.sha256(lines.encode()).hexdigest()

    def save(self) -> None:
        """Remember what was verified (best effort: a read-only store just re-hashes next time)."""
        if not self._changed or self._user_key is None:
            return
        try:
            self.cache_path.parent.mkdir(exist_ok=True)
            if self.cache_path.parent.is_symlink():  # never write through a link out of the store
                return
            signed = {"entries": self.cache, "mac": self._mac(self.cache)}
            atomic_write_text(self.cache_path, json.dumps(signed, sort_keys=True), write_through=False)
        except OSError:
            pass


def _read_shard(path: Path) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        # shards written by other tools may hold several batches: merge them (one copy)
        batch = reader.get_batch(0) if reader.num_record_batches == 1 else reader.read_all().combine_chunks().to_batches()[0]
        batch.validate(full=True)  # lengths and offsets agree, so numpy views stay in bounds
        return batch
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, IndexError, UnicodeDecodeError) as exc:
        raise RlpipeError(f"corrupted shard {path}: {exc} (run `rlpipe datasets validate`)") from None


def _columns(
    batch: pa.RecordBatch,
    observation_space: gym.Space,
    action_space: gym.Space,
    info_space: gym.spaces.Dict | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, Columnar]:
    """A batch's columns (all, or `names`) as numpy, compressed frames decoded (CorruptFrame
    naming the column and row of one that does not decode)."""
    spaces = {"obs": observation_space, "action": action_space, "next_obs": observation_space}
    spaces.update({name: info_space for name in INFO_COLUMNS if info_space is not None})
    columns: dict[str, Columnar] = {}
    for name in names or batch.schema.names:
        column = batch.column(name)
        if name == "agent":
            columns[name] = column.to_numpy(zero_copy_only=False)
        elif name in spaces:
            try:
                columns[name] = from_arrow(column, spaces[name])
            except CorruptFrame as exc:
                raise CorruptFrame(f"{name} {exc}") from None
        else:
            columns[name] = scalar_from_arrow(column)
    if "next_obs" in columns and is_frame_column(batch.column("next_obs")):
        obs = columns.get("obs")
        if obs is None:
            obs = _columns(batch, observation_space, action_space, info_space, ("obs",))["obs"]
        # compressed frames are image arrays, never dicts
        columns["next_obs"] = fill_chained(cast(np.ndarray, columns["next_obs"]), batch.column("next_obs"), cast(np.ndarray, obs))
    return columns


def info_space_of(info: DatasetInfo) -> gym.spaces.Dict | None:
    """The space of a dataset's `info`/`next_info` columns (None when it stores no infos);
    opening the dataset checked it (`rlpipe.datasets.store`)."""
    serialized = info.metadata.get("info_space")
    if serialized is None:
        return None
    where = f"{info.path / METADATA_FILE} 'info_space'"
    space = space_from_json(serialized, where)
    if not isinstance(space, gym.spaces.Dict):
        raise RlpipeError(f"{where} is a {type(space).__name__} space, not a Dict of info keys")
    return space


def read_shard(
    path: Path, observation_space: gym.Space, action_space: gym.Space, info_space: gym.spaces.Dict | None = None
) -> dict[str, Columnar]:
    """One shard's columns as numpy arrays (zero-copy views of the memory map where possible).

    Unverified: a writer reading back its own shards uses it; readers of stored datasets go
    through `load_shards` / `ShardVerifier`."""
    try:
        return _columns(_read_shard(path), observation_space, action_space, info_space)
    except CorruptFrame as exc:
        raise RlpipeError(f"corrupted shard {path}: {exc} (run `rlpipe datasets validate`)") from None


def verified_shard_paths(info: DatasetInfo) -> list[Path]:
    """The shards of `info` after every check loading runs (for polars scans and mapped
    reading): one shard in memory at a time."""
    verifier = ShardVerifier(info)
    for rel in info.shard_rels:
        verifier.read(rel, ("episode_id",))
    verifier.finish()
    return info.shard_paths


def shards_digest(info: DatasetInfo) -> str:
    """sha256 over the verified shards of `info` (what a run trained on read)."""
    verifier = ShardVerifier(info)
    for rel in info.shard_rels:
        verifier.check_hash(rel)
    return verifier.digest()


def load_shards(info: DatasetInfo) -> TransitionArrays:
    """Load all shards of a dataset into TransitionArrays, verifying them (module doc).

    A single shard is returned zero-copy (read-only views of the memory map) except for
    boolean columns, which Arrow bit-packs; several shards are concatenated once.
    """
    verifier = ShardVerifier(info)
    parts = [verifier.read(rel) for rel in info.shard_rels]
    verifier.finish()
    merged = {key: concat_columnar([part[key] for part in parts]) for key in parts[0]}
    return TransitionArrays(**cast("dict[str, Any]", merged))


def load_dataset(name: str, store: str | os.PathLike | None = None) -> TransitionArrays:
    """Load dataset `name` from the store into contiguous arrays (memory-mapped, see load_shards)."""
    return load_shards(open_dataset(name, store))
