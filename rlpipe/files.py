"""File helpers every layer shares: one content hash and one atomic write.

Beside ``errors.py`` at the bottom of the package, so checkpoints (models), datasets and
runs (training) hash and replace files the same way.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HASH_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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
