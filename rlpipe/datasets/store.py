"""The dataset store: where datasets live, how they are named, and reading their metadata.

A dataset is a directory `<store>/<name>/` holding `metadata.json`, `steps/*.arrow` and,
optionally, Minari's HDF5 layout under `data/` (so `minari.load_dataset(name)` reads it when
`MINARI_DATASETS_PATH` points at the store). A directory without `metadata.json` is not a
dataset: writers build in a hidden temporary directory and rename it into place when done
(`rlpipe.storage.atomic`). Opening a dataset checks its metadata (keys, types, paths, the
name) and its file layout (no missing, resized or stray files); the loader then checks the
bytes it reads against the recorded sha256 (`rlpipe.datasets.loader`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, cast

import gymnasium as gym
import numpy as np

from rlpipe.datasets.schema import FORMAT_NAME, FORMAT_VERSION, step_schema
from rlpipe.envs.spaces import space_from_json
from rlpipe.errors import ArgumentError, RlpipeError
from rlpipe.storage import atomic, names
from rlpipe.storage.files import check_output_dir, loads_json, read_limited, sha256_file

METADATA_FILE = "metadata.json"
STEPS_DIR = "steps"
MINARI_DIR = "data"
MINARI_HDF5_FILE = "main_data.hdf5"
MINARI_METADATA_FILE = f"{MINARI_DIR}/metadata.json"
# Paths a dataset's `files` may name: a plain file name in steps/ or data/.
_FILE_KEY_RE = re.compile(r"^(steps|data)/[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def store_root(store: str | os.PathLike | None = None) -> Path:
    """The store directory: `store` if given, else `$RLPIPE_DATASETS`, else `./datasets`.

    A path that is or lies below something other than a directory, or that cannot be made
    (`check_output_dir`: a name too long), is an RlpipeError."""
    root = Path(store) if store is not None else Path(os.environ.get("RLPIPE_DATASETS") or "datasets")
    check_output_dir("" if store is not None and os.fspath(store) == "" else root, "dataset store")  # "" is refused, not "."
    return root


def check_name(name: str) -> str:
    """Return `name` if it is a valid dataset name (`rlpipe.storage.names`: the one pattern of
    dataset, run and sweep names), else raise."""
    return names.check_name(name, "dataset name")


def is_dataset_dir(path: Path) -> bool:
    """Whether `path` is a published dataset directory (it has metadata.json)."""
    return (path / METADATA_FILE).is_file()


def check_new_name(root: Path, name: str) -> None:
    """Raise if `name` differs only in case from another entry of the store (two such
    datasets cannot live side by side on case-insensitive file systems)."""
    try:
        entries = os.listdir(root)
    except OSError:
        return
    clash = sorted(entry for entry in entries if entry.lower() == name.lower() and entry != name)
    if clash:
        raise RlpipeError(f"dataset name {name!r} differs only in case from the existing {clash[0]!r}; choose another name")


def hash_files(directory: Path, relative_paths: list[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """Per-file sha256 and size, and the content hash: one digest over the data files.

    Minari's metadata.json names the dataset, so it is left out of the content hash: the
    same data under another name has the same content hash.
    """
    files = {rel: {"sha256": sha256_file(directory / rel), "bytes": (directory / rel).stat().st_size} for rel in sorted(relative_paths)}
    data_files = [rel for rel in files if rel != MINARI_METADATA_FILE]
    combined = hashlib.sha256("".join(f"{rel}:{files[rel]['sha256']}\n" for rel in data_files).encode())
    return files, combined.hexdigest()


@dataclass(frozen=True)
class DatasetInfo:
    """A stored dataset: its directory and parsed metadata."""

    path: Path
    metadata: dict[str, Any]

    @property
    def name(self) -> str:
        return self.metadata["name"]

    @property
    def observation_space(self) -> gym.Space:
        return space_from_json(self.metadata["observation_space"], f"{self.path / METADATA_FILE} 'observation_space'")

    @property
    def action_space(self) -> gym.Space:
        return space_from_json(self.metadata["action_space"], f"{self.path / METADATA_FILE} 'action_space'")

    @property
    def env_id(self) -> str | None:
        return self.metadata.get("env_id")

    @property
    def frame_codec(self) -> str | None:
        """How image observations are compressed (`rlpipe.datasets.codec`); None: stored plain."""
        return self.metadata.get("frame_codec")

    @property
    def step_bytes(self) -> int:
        """The step shards' bytes once read: their file sizes, plus the decoded obs and
        next_obs frames of a dataset that stores them compressed."""
        files = sum(entry["bytes"] for rel, entry in self.metadata["files"].items() if rel.startswith(STEPS_DIR + "/"))
        if self.frame_codec is None:
            return files
        return files + 2 * self.metadata["total_steps"] * int(np.prod(cast(gym.spaces.Box, self.observation_space).shape))  # a uint8 image

    @property
    def shard_rels(self) -> list[str]:
        """The step shards' paths relative to the dataset directory, in order."""
        return [rel for rel in sorted(self.metadata["files"]) if rel.startswith(STEPS_DIR + "/")]

    @property
    def shard_paths(self) -> list[Path]:
        return [self.path / rel for rel in self.shard_rels]

    @property
    def hdf5_path(self) -> Path | None:
        path = self.path / MINARI_DIR / MINARI_HDF5_FILE
        return path if f"{MINARI_DIR}/{MINARI_HDF5_FILE}" in self.metadata["files"] else None


def read_metadata(path: Path) -> dict[str, Any]:
    """Parse and check a dataset's metadata.json: format and version, required keys and their
    types, the spaces, file paths that stay inside the dataset, and the name."""
    meta_path = path / METADATA_FILE
    try:
        metadata = loads_json(read_limited(meta_path, follow_links=True))
    except FileNotFoundError:
        raise RlpipeError(f"{path} is not a dataset (no {METADATA_FILE})") from None
    except (ValueError, RecursionError) as exc:  # malformed JSON, NaN or Infinity, bad UTF-8
        raise RlpipeError(f"corrupted {meta_path}: {exc}") from None
    except OSError as exc:
        raise RlpipeError(f"cannot read {meta_path}: {exc.strerror or exc}") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise RlpipeError(f"{meta_path} is not rlpipe dataset metadata")
    version = metadata.get("format_version")
    if not _is_int(version) or version < 1:  # no rlpipe wrote it: not a version a newer one reads either
        raise RlpipeError(f"corrupted {meta_path}: 'format_version' is {json.dumps(version)}, not a version number (1 or more)")
    if version > FORMAT_VERSION:
        raise RlpipeError(
            f"dataset {path.name} uses format version {version}; this rlpipe reads versions up to {FORMAT_VERSION} (upgrade rlpipe)"
        )
    problem = _metadata_problem(metadata, path.name)
    if problem:
        raise RlpipeError(f"corrupted {meta_path}: {problem}")
    return metadata


def _is_int(value: Any) -> TypeGuard[int]:
    """An integer that fits int64, as every count and version in metadata does (JSON has no limit)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


_REQUIRED_KEYS: dict[str, Any] = {
    "name": str,
    "observation_space": str,
    "action_space": str,
    "multi_agent": bool,
    "producer": dict,
    "total_episodes": int,
    "total_steps": int,
    "formats": list,
    "files": dict,
    "content_hash": str,
}


def _metadata_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    """The first thing wrong with parsed metadata, or None."""
    for check in (_required_problem, _statistics_problem, _formats_problem, _files_problem, _spaces_problem):
        problem = check(metadata, dir_name)
        if problem:
            return problem
    return _lineage_problem(metadata)


def _required_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    """Required keys, their types, the name, integers in range and the producer."""
    for key, kind in _REQUIRED_KEYS.items():
        value = metadata.get(key)
        ok = _is_int(value) and value >= 0 if kind is int else isinstance(value, kind)
        if not ok:
            return f"{key!r} is missing or not a {'non-negative integer below 2**63' if kind is int else kind.__name__}"
    if metadata["name"] != dir_name:
        return f"it names dataset {metadata['name']!r}, but its directory is {dir_name!r}"
    for key in ("env_id", "env_spec", "eval_env_spec"):
        if not isinstance(metadata.get(key), (str, type(None))):
            return f"{key!r} is not a string or null"
    oversized = _oversized_int({key: value for key, value in metadata.items() if key != "episode_seeds"}, "")
    if oversized is not None:
        return f"{oversized!r} holds an integer beyond the 64-bit range the format allows"
    return _producer_problem(metadata["producer"])


def _statistics_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    """The kind, and an episodes dataset's return and length statistics."""
    kind = metadata.get("kind", "episodes")
    if kind not in ("episodes", "transitions"):
        return f"unknown kind {kind!r}"
    for key in ("episode_return", "episode_length") if kind == "episodes" else ():  # transitions have no episode statistics
        if not isinstance(metadata.get(key), dict):
            return f"{key!r} is missing or not a dict"
        if not all(_is_number(metadata[key].get(stat)) for stat in ("mean", "std", "min", "max")):
            return f"{key!r} needs numbers mean, std, min and max"
    for key in ("ref_min_score", "ref_max_score"):  # what normalised scores divide by (rlpipe.datasets.scores)
        score = metadata.get(key)
        if not _is_number(score) or (score is not None and not math.isfinite(score)):
            return f"{key!r} is not a finite number or null"
    return None


def _formats_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    formats = metadata["formats"]
    if "arrow" not in formats or len(set(map(repr, formats))) < len(formats) or not all(fmt in ("arrow", "hdf5") for fmt in formats):
        return f"formats {formats!r}: expected 'arrow', optionally with 'hdf5', each once"
    return None


def _files_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    """Each listed file a plain file of the dataset, with its digest and size."""
    for rel, facts in metadata["files"].items():
        if not _FILE_KEY_RE.fullmatch(rel):
            return f"file path {rel!r} is not a plain file in {STEPS_DIR}/ or {MINARI_DIR}/"
        if not (
            isinstance(facts, dict)
            and isinstance(facts.get("sha256"), str)
            and _SHA256_RE.fullmatch(facts["sha256"])
            and _is_int(facts.get("bytes"))
            and facts["bytes"] >= 0
        ):
            return f"file {rel!r} needs a sha256 hex digest and a byte count"
    return None


def _spaces_problem(metadata: dict[str, Any], dir_name: str) -> str | None:
    """The serialized spaces parse, and make a step schema together."""
    parsed = {}
    for key in ("observation_space", "action_space", "info_space"):
        if key == "info_space" and metadata.get(key) is None:
            continue
        if not isinstance(metadata[key], str):
            return f"{key!r} is not a string or null"  # the required spaces are checked above
        try:
            parsed[key] = space_from_json(metadata[key])
        except RlpipeError as exc:
            return f"{key!r} is an unreadable space: {exc}"
    if "info_space" in parsed and not isinstance(parsed["info_space"], gym.spaces.Dict):
        return f"'info_space' is a {type(parsed['info_space']).__name__} space, not a Dict of info keys"
    try:
        step_schema(
            parsed["observation_space"],
            parsed["action_space"],
            metadata["multi_agent"],
            cast("gym.spaces.Dict | None", parsed.get("info_space")),  # checked above
            metadata.get("frame_codec"),
        )
    except RlpipeError as exc:
        return str(exc)
    except Exception as exc:
        return f"unreadable space ({type(exc).__name__}: {exc})"
    return None


_KIND_WORDS: dict[type, str] = {str: "a string", dict: "an object", list: "a list"}
# The producer's fields every writer records the same way, and their types (others are each writer's own).
_PRODUCER_FIELDS: dict[str, tuple[type, ...]] = {
    "algorithm": (str,),
    "seed": (int, type(None)),
    "num_envs": (int,),
    "params": (dict,),
    "checkpoint_sha256": (str, type(None)),
}


def _oversized_int(value: Any, where: str) -> str | None:
    """The path of the first integer in ``value`` outside int64 (JSON has no limit; the format
    does, but for `episode_seeds`, which keep Minari's unsigned 64-bit seeds), or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if _is_int(value) else where or "(top level)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _oversized_int(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _producer_problem(producer: dict[str, Any], where: str = "producer") -> str | None:
    """A producer field of the wrong type (bools are not counts), or None."""
    return _optional_fields_problem(producer, where, _PRODUCER_FIELDS)


def _optional_fields_problem(record: dict[str, Any], where: str, fields: dict[str, tuple[type, ...]]) -> str | None:
    """The first of ``fields`` present in ``record`` with another type (a bool is no integer), or None."""
    for key, kinds in fields.items():
        if key in record and (not isinstance(record[key], kinds) or isinstance(record[key], bool)):
            return f"'{where}.{key}' is not {' or '.join('null' if kind is type(None) else kind.__name__ for kind in kinds)}"
    return None


def _lineage_problem(metadata: dict[str, Any]) -> str | None:
    """What is wrong with the `lineage` of a derived dataset (`rlpipe.datasets.ops`) or the
    `provenance` of a relabelled one (`rlpipe.datasets.her`), the records `rlpipe datasets
    lineage` and the report walk, or None; each problem names the field."""
    if "lineage" in metadata:
        problem = _record_problem(metadata["lineage"], "lineage")
        if problem:
            return problem
    return _provenance_problem(metadata["provenance"], "provenance") if "provenance" in metadata else None


def _fields_problem(value: Any, where: str, kinds: dict[str, type]) -> str | None:
    if not isinstance(value, dict):
        return f"{where!r} is not an object"
    for key, kind in kinds.items():
        if not isinstance(value.get(key), kind):
            return f"'{where}.{key}' is missing or not {_KIND_WORDS[kind]}"
    return None


def _record_problem(record: Any, where: str) -> str | None:
    """A derivation: its operation, arguments and the parents it was made from."""
    problem = _fields_problem(record, where, {"operation": str, "arguments": dict, "parents": list})
    for i, parent in enumerate([] if problem else record["parents"]):
        problem = problem or _node_problem(parent, f"{where}.parents[{i}]")
    return problem


def _node_problem(node: Any, where: str) -> str | None:
    """A parent: its name and content hash, and how it came to be (lineage, provenance or producer)."""
    problem = _fields_problem(node, where, {"name": str, "content_hash": str})
    if problem:
        return problem
    if "lineage" in node:
        problem = _record_problem(node["lineage"], f"{where}.lineage")
    if not problem and "provenance" in node:
        problem = _provenance_problem(node["provenance"], f"{where}.provenance")
    if not problem and "producer" in node:
        producer = node["producer"]
        problem = _producer_problem(producer, f"{where}.producer") if isinstance(producer, dict) else f"'{where}.producer' is not an object"
    # The parent's row count, which `rlpipe datasets lineage` shows (ops._lineage_node records it).
    if not problem and "total_steps" in node and not (_is_int(node["total_steps"]) and node["total_steps"] >= 0):
        problem = f"'{where}.total_steps' is not a non-negative integer"
    return problem


def _provenance_problem(provenance: Any, where: str) -> str | None:
    """A relabelling: the name and content hash of the dataset it relabelled, and the settings
    `rlpipe.datasets.her` records beside them (shown by `rlpipe datasets lineage`)."""
    return _fields_problem(provenance, where, {"source_dataset": str, "source_content_hash": str}) or _optional_fields_problem(
        provenance, where, _PROVENANCE_FIELDS
    )


# The settings a HER relabelling records (`rlpipe.datasets.her.relabel_dataset`), and their types.
_PROVENANCE_FIELDS: dict[str, tuple[type, ...]] = {
    "transform": (str,),
    "strategy": (str,),
    "k": (int,),
    "seed": (int, type(None)),
    "original_episodes": (int,),
}


def layout_problems(info: DatasetInfo) -> list[str]:
    """Files recorded but missing or of another size, and stray files in steps/ or data/
    (a shard nobody listed would otherwise be read by `steps/*.arrow` globs)."""
    problems = []
    for rel, facts in sorted(info.metadata["files"].items()):
        path = info.path / rel
        if not path.is_file():
            problems.append(f"missing file {rel}")
        elif path.stat().st_size != facts["bytes"]:
            problems.append(f"{rel} is {path.stat().st_size} bytes, metadata says {facts['bytes']} (truncated or modified)")
    for folder in (STEPS_DIR, MINARI_DIR):
        directory = info.path / folder
        if directory.is_dir():
            stray = sorted(f"{folder}/{entry}" for entry in os.listdir(directory) if f"{folder}/{entry}" not in info.metadata["files"])
            problems += [f"stray file {rel} (not listed in metadata)" for rel in stray]
    if not info.shard_rels:
        problems.append("no step shards")
    return problems


def _dataset_path(root: Path, name: str) -> Path:
    path = root / check_name(name)
    if path.is_symlink():
        raise RlpipeError(f"{path} is a symbolic link, not a dataset directory")
    return path


def open_dataset(name: str, store: str | os.PathLike | None = None, check_files: bool = True) -> DatasetInfo:
    """Find dataset `name` in the store and check its metadata and (with `check_files`) its
    file layout, or raise a one-line error. An interrupted replace of it is rolled back first.
    Within `reusing_opened` of this dataset, the info opened there is returned instead."""
    root = store_root(store)
    path = _dataset_path(root, name)
    reused = _reused(path)
    if reused is not None:
        return reused
    atomic.recover_name(root, path.name, is_dataset_dir)
    if not is_dataset_dir(path):
        available = ", ".join(info.name for info in list_datasets(root)) or "none"
        raise ArgumentError(f"dataset {name!r} not found in {root} (available: {available})")
    return _checked_info(path, check_files)


def _checked_info(path: Path, check_files: bool = True) -> DatasetInfo:
    info = DatasetInfo(path, read_metadata(path))
    name = path.name
    problems = layout_problems(info) if check_files else []
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RlpipeError(f"dataset {name!r} is corrupted: {problems[0]}{more} (run `rlpipe datasets validate`)")
    return info


# The dataset one training run opened and checked at its start, with its files' stats then:
# its later opens reuse it (`reusing_opened`).
_OPENED: ContextVar[tuple[DatasetInfo, tuple[Any, ...]] | None] = ContextVar("rlpipe_opened_dataset", default=None)


@contextmanager
def reusing_opened(info: DatasetInfo | None) -> Iterator[None]:
    """Within this block (one run, after `info` was opened and checked at its edge),
    `open_dataset` of the same dataset returns `info` instead of reading and checking it again,
    as long as none of the files those checks read has changed since the block began (a
    changed, replaced or added file: opened afresh). None: nothing to reuse."""
    token = _OPENED.set(None if info is None else (info, _files_stats(info)))
    try:
        yield
    finally:
        _OPENED.reset(token)


def _files_stats(info: DatasetInfo) -> tuple[Any, ...]:
    """(inode, size, mtime) of what opening `info` checks: metadata.json, every recorded file
    and the folders whose stray files it refuses (None for one that is missing)."""
    paths = [
        info.path / METADATA_FILE,
        *(info.path / rel for rel in sorted(info.metadata["files"])),
        info.path / STEPS_DIR,
        info.path / MINARI_DIR,
    ]
    stats: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            stats.append(None)
        else:
            stats.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(stats)


def _reused(path: Path) -> DatasetInfo | None:
    """The info `reusing_opened` holds when it is of the dataset at `path` and still current."""
    opened = _OPENED.get()
    if opened is None:
        return None
    info, stats = opened
    if info.path.resolve() != path.resolve() or _files_stats(info) != stats:
        return None
    return info


def store_entries(store: str | os.PathLike | None = None) -> list[tuple[str, DatasetInfo | RlpipeError]]:
    """Every dataset directory in the store, sorted by name, with its info or what is wrong
    with it (corrupt, newer format, bad layout): broken datasets are listed, not hidden."""
    root = store_root(store)
    if not root.is_dir():
        return []
    atomic.recover_all(root, is_dataset_dir)
    found: list[tuple[str, DatasetInfo | RlpipeError]] = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or not (path.is_dir() or path.is_symlink()):
            continue
        try:
            if path.is_symlink() or not is_dataset_dir(path):
                raise RlpipeError(f"{path} is not a dataset directory (a symbolic link, or no {METADATA_FILE})")
            found.append((path.name, _checked_info(path)))
        except RlpipeError as exc:
            found.append((path.name, exc))
    return found


def list_datasets(store: str | os.PathLike | None = None) -> list[DatasetInfo]:
    """Every intact dataset in the store, sorted by name (see `store_entries` for broken ones)."""
    return [entry for _, entry in store_entries(store) if isinstance(entry, DatasetInfo)]


def remove_dataset(name: str, store: str | os.PathLike | None = None) -> Path:
    """Delete a dataset directory, broken or not; the rename first makes the removal look
    atomic to readers."""
    root = store_root(store)
    path = _dataset_path(root, name)
    fd = atomic.lock(root, name, f"dataset {name!r}") if root.is_dir() else None
    try:
        atomic.recover(root, name, is_dataset_dir)
        if not (path / METADATA_FILE).exists():
            raise RlpipeError(f"dataset {name!r} not found in {root}")
        atomic.delete_directory(path)
    finally:
        if fd is not None:
            atomic.unlock(fd)
    return path
