"""The dataset store: where datasets live, how they are named, and reading their metadata.

A dataset is a directory `<store>/<name>/` holding `metadata.json`, `steps/*.arrow` and,
optionally, Minari's HDF5 layout under `data/` (so `minari.load_dataset(name)` reads it when
`MINARI_DATASETS_PATH` points at the store). A directory without `metadata.json` is not a
dataset: writers build in a hidden temporary directory and rename it into place when done.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
from minari.serialization import deserialize_space

from rlpipe.datasets.schema import FORMAT_NAME, FORMAT_VERSION
from rlpipe.errors import RlpipeError
from rlpipe.files import sha256_file

METADATA_FILE = "metadata.json"
STEPS_DIR = "steps"
MINARI_DIR = "data"
MINARI_HDF5_FILE = "main_data.hdf5"
MINARI_METADATA_FILE = f"{MINARI_DIR}/metadata.json"
TEMP_PREFIX = ".tmp-"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def store_root(store: str | os.PathLike | None = None) -> Path:
    """The store directory: `store` if given, else `$RLPIPE_DATASETS`, else `./datasets`."""
    if store is not None:
        return Path(store)
    return Path(os.environ.get("RLPIPE_DATASETS") or "datasets")


def check_name(name: str) -> str:
    """Return `name` if it is a valid dataset name (no path separators, no `..`), else raise."""
    if not _NAME_RE.match(name) or ".." in name:
        raise RlpipeError(
            f"invalid dataset name {name!r}: use letters, digits, '-', '_' and '.', "
            "starting with a letter or digit, without '/' or '..'"
        )
    return name


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
        return deserialize_space(self.metadata["observation_space"])

    @property
    def action_space(self) -> gym.Space:
        return deserialize_space(self.metadata["action_space"])

    @property
    def env_id(self) -> str | None:
        return self.metadata.get("env_id")

    @property
    def shard_paths(self) -> list[Path]:
        return [self.path / rel for rel in sorted(self.metadata["files"]) if rel.startswith(STEPS_DIR + "/")]

    @property
    def hdf5_path(self) -> Path | None:
        path = self.path / MINARI_DIR / MINARI_HDF5_FILE
        return path if f"{MINARI_DIR}/{MINARI_HDF5_FILE}" in self.metadata["files"] else None


def read_metadata(path: Path) -> dict[str, Any]:
    """Parse and check a dataset's metadata.json (format name and version)."""
    meta_path = path / METADATA_FILE
    try:
        metadata = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise RlpipeError(f"{path} is not a dataset (no {METADATA_FILE})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RlpipeError(f"corrupted {meta_path}: {exc}") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise RlpipeError(f"{meta_path} is not rlpipe dataset metadata")
    version = metadata.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RlpipeError(
            f"dataset {path.name} uses format version {version}; this rlpipe reads versions up to {FORMAT_VERSION} (upgrade rlpipe)"
        )
    return metadata


def open_dataset(name: str, store: str | os.PathLike | None = None) -> DatasetInfo:
    """Find dataset `name` in the store and read its metadata, or raise a one-line error."""
    root = store_root(store)
    path = root / check_name(name)
    if not (path / METADATA_FILE).exists():
        available = ", ".join(info.name for info in list_datasets(root)) or "none"
        raise RlpipeError(f"dataset {name!r} not found in {root} (available: {available})")
    return DatasetInfo(path, read_metadata(path))


def list_datasets(store: str | os.PathLike | None = None) -> list[DatasetInfo]:
    """Every complete dataset in the store, sorted by name (temporary directories are skipped)."""
    root = store_root(store)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or not (path / METADATA_FILE).is_file():
            continue
        try:
            found.append(DatasetInfo(path, read_metadata(path)))
        except RlpipeError:
            continue
    return found


def remove_dataset(name: str, store: str | os.PathLike | None = None) -> Path:
    """Delete a dataset directory; the rename first makes the removal look atomic to readers."""
    info = open_dataset(name, store)
    doomed = info.path.with_name(f"{TEMP_PREFIX}rm-{info.path.name}")
    if doomed.exists():
        shutil.rmtree(doomed)
    info.path.rename(doomed)
    shutil.rmtree(doomed)
    return info.path
