"""File helpers every layer shares: one content hash, one atomic write, one JSON reader.

Just above ``errors.py`` at the bottom of the package, so checkpoints (nets), datasets and
runs (training) hash, replace and parse files the same way, and every file output a user
names (``--out``, ``--metrics``, ``--markdown``, ``--onnx``...) is checked and written by
:func:`check_output_file` and :func:`atomic_output`: a regular file is replaced atomically,
a character device or a FIFO (``/dev/null``, ``/dev/stdout``, a named pipe) is written
through, never replaced, and anything else is refused in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlpipe.errors import OutputError

_HASH_CHUNK = 1 << 22
MAX_JSON_BYTES = 64 << 20  # metadata, checkpoint records and caches are kilobytes to a few MiB
# What rlpipe adds to an output's name for the files it makes beside it: `.tmp-<pid>-<id>-NAME`
# (22 bytes at most), a replaced run's `.rm-<id>-.trash-<id>-NAME` (29), `.rlpipe-lock-NAME`.
NAME_ROOM = 32


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


def _not_writable_kind(mode: int) -> str | None:
    """Why an existing entry of ``mode`` cannot be a file output, or None if it can."""
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    if stat.S_ISDIR(mode):
        return "it is a directory"
    kind = next((name for test, name in ((stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")) if test(mode)), "not a file")
    return f"it is {kind} (outputs are regular files, character devices or FIFOs)"


def _name_length_problem(path: Path, folder: Path) -> str | None:
    """Why the names of ``path`` below ``folder``, its nearest existing directory, cannot be
    made there, or None: a folder name longer than the file system allows, or a last name
    without room for the temporary and lock names rlpipe makes beside it (``NAME_ROOM``).
    Checked up front, as the open or mkdir would fail only after the work (or half the folders)."""
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except OSError:  # a file system that does not say: the write itself reports it
        return None
    for part in path.parts[len(folder.parts) : -1]:
        if len(os.fsencode(part)) > limit:
            return f"a folder name of {len(os.fsencode(part))} bytes is longer than the file system allows ({limit})"
    size = len(os.fsencode(path.name))
    if size > limit - NAME_ROOM:
        return f"its name is {size} bytes long: at most {limit - NAME_ROOM} here (the file system's {limit} less {NAME_ROOM} for temporary names)"
    return None


def check_output_dir(path: str | os.PathLike, what: str) -> None:
    """Fail now, before any work and without creating anything, if ``path`` cannot be a
    directory to write into (made with its parents where missing): an OutputError naming
    ``what`` (``--out``, ``dataset store``) for a path that is, or lies below, something other
    than a directory (a file, a FIFO, a device; links followed), that cannot be looked up (a
    name too long, a link loop, no permission), or whose names `_name_length_problem` refuses;
    an empty name too, which would otherwise mean the current directory."""
    if os.fspath(path) == "":
        raise OutputError(f"{what}: an empty path (name a directory, '.' for the current one)")
    path = Path(path)
    existing = path
    while True:
        try:
            mode = os.stat(existing).st_mode
            break
        except (FileNotFoundError, NotADirectoryError) as exc:  # missing, or below a non-directory: look further up
            if existing == existing.parent:
                raise OutputError(f"{what} {path}: {exc.strerror}") from None
            existing = existing.parent
        except (OSError, ValueError) as exc:  # a name too long, a link loop, no permission, a NUL
            raise OutputError(f"{what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{what} {path} is not a directory" if existing == path else f"{what} {path}: {existing} is not a directory")
    problem = _name_length_problem(path, existing)
    if problem:
        raise OutputError(f"{what} {path}: {problem}")


def check_output_file(path: str | os.PathLike, option: str | None = None, make_parents: bool = False) -> bool:
    """Fail now, before any work and without creating anything, if ``path`` cannot be written
    by :func:`atomic_output`: an OutputError (one line naming ``option``, e.g. ``--out``) for a
    directory, a block device or a socket, a missing parent (unless ``make_parents``: then the
    nearest existing ancestor must be a directory to make them in), a name too long
    (`_name_length_problem`), or a directory where no file can be created (read-only, no
    permission, /proc). Returns whether ``path`` is a character device or a FIFO, which is
    written through."""
    path = Path(path)
    where = f"{path} ({option})" if option else str(path)

    def refuse(problem: str) -> OutputError:
        return OutputError(f"cannot write {where}: {problem}")

    try:
        mode: int | None = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as exc:  # a file where a folder should be, a link loop, a name too long, a NUL
        raise refuse(getattr(exc, "strerror", None) or str(exc)) from None
    if mode is not None:
        problem = _not_writable_kind(mode)
        if problem is not None:
            raise refuse(problem)
        if not stat.S_ISREG(mode):
            if not os.access(path, os.W_OK):
                raise refuse("permission denied")
            return True
    problem = _new_file_problem(path, make_parents)
    if problem:
        raise refuse(problem)
    return False


def _new_file_problem(path: Path, make_parents: bool) -> str | None:
    """Why no file can be created at ``path`` (its folder missing, not a folder, the name too
    long, creation refused), or None."""
    folder = path.parent
    if not make_parents and not folder.is_dir():
        return f"directory {folder} does not exist" if not os.path.lexists(folder) else f"{folder} is not a directory"
    while not os.path.lexists(folder) and folder != folder.parent:  # the directories to make go in the nearest existing one
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    problem = _name_length_problem(path, folder)
    if problem:
        return problem
    probe = folder / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
    except OSError as exc:
        return f"cannot create a file in {folder}: {exc.strerror or exc}"
    return None


@contextmanager
def atomic_output(path: str | os.PathLike, *, write_through: bool = True) -> Iterator[Path]:
    """Yield a temporary file to write in place of ``path``; on an error it is deleted.

    A regular (or missing) ``path``: the temporary file is its sibling, and on success it is
    fsynced and replaces ``path`` in one rename (the directory fsynced too): readers see the
    old file or the whole new one, never half, even after a power loss. A character device or
    a FIFO (links followed: ``/dev/null``, ``/dev/stdout``): the temporary file lies in the
    system's temporary folder under ``path``'s name, and its bytes are then written to
    ``path``, which stays what it is. Anything else (a directory, a block device, a socket) is
    an OutputError before anything is written. ``write_through=False`` (rlpipe's own files,
    such as caches, which no user named): whatever ``path`` is gets replaced by the rename,
    a planted link or device included."""
    path = Path(path)
    try:
        mode: int | None = os.stat(path).st_mode if write_through else None
    except (OSError, ValueError):
        mode = None  # missing (or unreachable: making the temporary file says why)
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        folder = Path(tempfile.mkdtemp(prefix="rlpipe-output-"))
        try:
            tmp = folder / (path.name if path.name not in ("", ".", "..") else "output")
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            yield tmp
            _write_through(tmp, path)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    if mode is not None and (problem := _not_writable_kind(mode)) is not None:
        raise OutputError(f"cannot write {path}: {problem}")
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        # Created exclusively (never through a planted link); the pid first keeps the name
        # out of the pattern `rlpipe.storage.atomic` recovers, which never sees a live writer's file.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _write_through(source: Path, target: Path) -> None:
    """Write ``source``'s bytes to the character device or FIFO ``target`` (opened without
    creating or truncating; a FIFO waits for its reader). A failed write is an OutputError."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):  # replaced since it was looked at
                raise OutputError(f"cannot write {target}: it is no longer a character device or a FIFO")
            with open(source, "rb") as handle:
                while chunk := handle.read(_HASH_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}") from None


def atomic_write_text(path: str | os.PathLike, text: str, *, write_through: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_output`)."""
    with atomic_output(path, write_through=write_through) as tmp:
        tmp.write_text(text)


USER_KEY_BYTES = 32


def user_cache_dir() -> Path:
    """rlpipe's folder in the user's cache: $RLPIPE_CACHE_DIR, else $XDG_CACHE_HOME/rlpipe, else ~/.cache/rlpipe."""
    if os.environ.get("RLPIPE_CACHE_DIR"):
        return Path(os.environ["RLPIPE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlpipe"


def user_key() -> bytes | None:
    """A secret only this user can read, made once in `user_cache_dir` (mode 0600): what signs
    the caches rlpipe keeps in places others may write (a dataset store's verification cache).
    None when it cannot be made or is not this user's private regular file: nothing is trusted then."""
    folder = user_cache_dir()
    key_path = folder / "verify.key"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not key_path.exists():
            fresh = folder / f".verify.key.{uuid.uuid4().hex}"
            descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(os.urandom(USER_KEY_BYTES))
            try:
                os.link(fresh, key_path)  # atomic: of two first runs at once, one key wins
            except FileExistsError:
                pass
            finally:
                fresh.unlink()
        descriptor = os.open(key_path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            facts = os.fstat(handle.fileno())
            private = stat.S_ISREG(facts.st_mode) and facts.st_uid == os.getuid() and not facts.st_mode & 0o077
            key = handle.read(USER_KEY_BYTES + 1)
    except OSError:
        return None
    return key if private and len(key) == USER_KEY_BYTES else None
