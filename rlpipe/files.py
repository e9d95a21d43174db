"""File helpers every layer shares: one content hash, one atomic write, one JSON reader.

Beside ``errors.py`` at the bottom of the package, so checkpoints (models), datasets and
runs (training) hash, replace and parse files the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_HASH_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def loads_json(text: str | bytes) -> Any:
    """Parse standard JSON. Python's json module also accepts ``NaN``, ``Infinity`` and
    numbers beyond float range (``1e400`` becomes infinity); here they are a ValueError, like
    any other malformed JSON, so no metadata or checkpoint value read back is non-finite."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not standard JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of float range")
    return value


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's or a directory's entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on success it is fsynced and replaces
    ``path`` in one rename (the directory fsynced too), on an error it is deleted. Readers see
    the old file or the whole new one, never half, even after a power loss."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_output`)."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)
