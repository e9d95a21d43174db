"""Crash- and race-safe publishing of directories: locks, fsync, atomic replace, recovery.

Datasets in a store, training run directories and Minari exports are all published the
same way, by a `StagedDirectory`:

1. hold the name's lock: `fcntl.flock` on `<parent>/.locks/<name, lower case>.lock`
   (a second writer of the same name gets a one-line error, not a lost update);
2. build the content in `<parent>/.tmp-<id>-<name>/` and fsync every file and directory;
3. if `<name>` exists, rename it to `<parent>/.trash-<id>-<name>/`;
4. rename the temporary directory to `<name>` and fsync `<parent>`;
5. rename the trash to `<parent>/.rm-<id>-<name>/` and delete it.

Whatever moment a process dies, `<name>` is complete (old or new) or absent with a complete
`.trash-*` beside it. `recover` (run by the next process that gets the name's lock) renames
such a trash back and deletes the `.tmp-*`, `.trash-*` and `.rm-*` leftovers of writers that
are gone: a name whose lock is free has no live writer.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any, Callable

from rlpipe.errors import RlpipeError
from rlpipe.files import fsync_path

LOCK_DIR = ".locks"
TEMP_PREFIX, TRASH_PREFIX, REMOVE_PREFIX = ".tmp-", ".trash-", ".rm-"
_LEFTOVER_RE = re.compile(r"^\.(tmp|trash|rm)-([0-9a-f]{8})-(.+)$")
# Test hook: `RLPIPE_FAULT_AT=<step>` kills the process (os._exit) at that step of a publish.
FAULT_ENV = "RLPIPE_FAULT_AT"
FAULT_EXIT_CODE = 86
_interrupted: int | None = None


def fault_point(step: str) -> None:
    """Die here, without cleanup, when the fault-injection hook names `step` (tests only)."""
    if os.environ.get(FAULT_ENV) == step:
        os._exit(FAULT_EXIT_CODE)


def _on_signal(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = signum
    raise KeyboardInterrupt


def handle_termination() -> None:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt and remember that they came, so a
    publish after a swallowed interrupt (C extensions may swallow it) still aborts."""
    global _interrupted
    _interrupted = None
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def interrupt_signal() -> int | None:
    """The signal that interrupted this process, if any (see `handle_termination`)."""
    return _interrupted


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if SIGINT or SIGTERM arrived, even if it was swallowed."""
    if _interrupted is not None:
        raise KeyboardInterrupt


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (files first, then their directories)."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def json_text(value: Any) -> str:
    """Standard JSON (sorted keys, indented); NaN or infinity is an RlpipeError, never written."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"
    except ValueError:
        bad = ", ".join(_non_finite_keys(value)) or "a value"
        raise RlpipeError(f"refusing to write non-standard JSON: NaN or infinity in {bad} (training diverged?)") from None


def _non_finite_keys(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [k for key, sub in value.items() for k in _non_finite_keys(sub, f"{prefix}{key}.")]
    if isinstance(value, (list, tuple)):
        return [k for i, sub in enumerate(value) for k in _non_finite_keys(sub, f"{prefix}{i}.")]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return [prefix.rstrip(".")]
    return []


def check_output_file(path: Path) -> None:
    """Fail now, before any work, if `path` cannot be written (a directory, no permission)."""
    if path.is_dir():
        raise RlpipeError(f"cannot write {path}: it is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex[:8]}-{path.name}")
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise RlpipeError(f"cannot write {path}: {exc.strerror or exc}") from None


def _lock_path(parent: Path, name: str) -> Path:
    return parent / LOCK_DIR / f"{name.lower()}.lock"


def try_lock(parent: Path, name: str) -> int | None:
    """The file descriptor holding `name`'s lock, or None if another process holds it."""
    path = _lock_path(parent, name)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def lock(parent: Path, name: str, what: str) -> int:
    """Take `name`'s lock or raise a one-line error naming the process that holds it."""
    fd = try_lock(parent, name)
    if fd is None:
        try:
            holder = f" (pid {_lock_path(parent, name).read_text().strip()})"
        except OSError:
            holder = ""
        raise RlpipeError(f"{what} is being written by another process{holder}; try again when it has finished")
    return fd


def unlock(fd: int) -> None:
    """Release a lock taken by `lock` or `try_lock` (the lock file stays: deleting it would race)."""
    os.close(fd)


def _leftovers(parent: Path) -> list[tuple[str, str, Path]]:
    """(kind, name, path) of every temporary, trash and removal entry in `parent`."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    found = []
    for entry in entries:
        match = _LEFTOVER_RE.match(entry.name)
        if match:
            found.append((match.group(1), match.group(3), Path(entry.path)))
    return found


def recover(parent: Path, name: str, is_complete: Callable[[Path], bool]) -> None:
    """Finish or roll back an interrupted publish or removal of `name`; the caller holds its lock.

    A missing `name` with a complete trash beside it is the old version of an interrupted
    replace: it is renamed back. Every other leftover of `name` is deleted.
    """
    final = parent / name
    mine = [(kind, path) for kind, other, path in _leftovers(parent) if other == name]
    if not os.path.lexists(final):
        for kind, path in mine:
            if kind == "trash" and is_complete(path):
                os.rename(path, final)
                fsync_path(parent)
                break
    for _, path in mine:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            path.unlink()


def recover_all(parent: Path, is_complete: Callable[[Path], bool], skip: str | None = None) -> None:
    """`recover` every name in `parent` with leftovers whose lock is free (best effort:
    a read-only directory is left as it is)."""
    for name in sorted({other for _, other, _ in _leftovers(parent)} - {skip}):
        try:
            fd = try_lock(parent, name)
        except OSError:
            return
        if fd is None:
            continue
        try:
            recover(parent, name, is_complete)
        finally:
            unlock(fd)


def delete_directory(path: Path) -> None:
    """Remove a directory so that no reader ever sees it half deleted (rename, then delete)."""
    doomed = path.with_name(f"{REMOVE_PREFIX}{uuid.uuid4().hex[:8]}-{path.name}")
    os.rename(path, doomed)
    fsync_path(path.parent)
    shutil.rmtree(doomed)


def publish(temp: Path, final: Path) -> None:
    """Move the finished directory `temp` to `final`, replacing any old one (the caller holds
    the lock). Every step is a rename, so a crash leaves old or new (see the module doc)."""
    check_interrupted()
    fsync_tree(temp)
    fault_point("synced")
    trash = None
    if os.path.lexists(final):
        trash = final.with_name(f"{TRASH_PREFIX}{uuid.uuid4().hex[:8]}-{final.name}")
        os.rename(final, trash)
        fault_point("old-moved")
    os.rename(temp, final)
    fsync_path(final.parent)
    fault_point("new-moved")
    if trash is not None:
        delete_directory(trash)
        fault_point("trash-deleted")


class StagedDirectory:
    """A directory built under a temporary name and published atomically by `commit`.

    Holds `final`'s lock from construction to `commit`/`abort`; construction recovers
    leftovers of dead writers in the same parent. `check` runs under the lock before
    anything is created (e.g. "exists and no --force").
    """

    def __init__(
        self,
        final: Path,
        what: str,
        is_complete: Callable[[Path], bool],
        check: Callable[[Path], None] | None = None,
    ) -> None:
        self.final = final
        self._is_complete = is_complete
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self._lock: int | None = lock(parent, final.name, what)
        except OSError as exc:
            raise RlpipeError(f"cannot write {what} in {parent}: {exc.strerror or exc}") from None
        try:
            recover(parent, final.name, is_complete)
            recover_all(parent, is_complete, skip=final.name)
            if check is not None:
                check(final)
            self.path = parent / f"{TEMP_PREFIX}{uuid.uuid4().hex[:8]}-{final.name}"
            self.path.mkdir()
        except BaseException:
            self._release()
            raise

    def commit(self) -> Path:
        """Publish the directory under its final name and release the lock (on failure the
        caller's `abort` cleans up)."""
        publish(self.path, self.final)
        self._release()
        return self.final

    def abort(self) -> None:
        """Delete everything written so far, undo a half-done replace, release the lock."""
        if self._lock is None:
            return
        try:
            shutil.rmtree(self.path, ignore_errors=True)
            recover(self.final.parent, self.final.name, self._is_complete)
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            unlock(self._lock)
            self._lock = None
