"""File helpers every layer shares: one content hash, one atomic write, one JSON reader.

Beside ``errors.py`` at the bottom of the package, so checkpoints (models), datasets and
runs (training) hash, replace and parse files the same way.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_HASH_CHUNK = 1 << 22
MAX_JSON_BYTES = 64 << 20  # metadata, checkpoint records and caches are kilobytes to a few MiB


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


def read_limited(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, follow_links: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes, else an OSError:
    for a device, a FIFO or a larger file (a planted link to /dev/zero or /proc/self/pagemap
    must not hang or exhaust the reader) and, unless ``follow_links``, for a symbolic link
    (DVC may check a dataset's files out as links into its cache)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = os.read(fd, limit + 1)
        if info.st_size > limit or len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on success it is fsynced and replaces
    ``path`` in one rename (the directory fsynced too), on an error it is deleted. Readers see
    the old file or the whole new one, never half, even after a power loss."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        # Created exclusively (never through a planted link); the pid first keeps the name
        # out of the pattern `rlpipe.datasets.atomic` recovers, which never sees a live writer's file.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
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
