"""Crash- and race-safe publishing of directories: locks, fsync, atomic replace, recovery.

Datasets in a store, training run directories and Minari exports are all published the
same way, by a `StagedDirectory`:

1. hold the name's lock: `fcntl.flock` on `<parent>/.locks/<name, lower case>.lock`
   when `<parent>` is a root (below), else on `<parent>/.rlpipe-lock-<name, lower case>`
   (a second writer of the same name gets a one-line error, not a lost update);
2. build the content in `<parent>/.tmp-<id>-<name>/` and fsync every file and directory;
3. if `<name>` exists, rename it to `<parent>/.trash-<id>-<name>/`;
4. rename the temporary directory to `<name>` and fsync `<parent>`;
5. rename the trash to `<parent>/.rm-<id>-<name>/` and delete it.

Whatever moment a process dies, `<name>` is complete (old or new) or absent with a complete
`.trash-*` beside it. `recover` (run by the next process that gets the name's lock) renames
such a trash back and deletes the `.tmp-*`, `.trash-*` and `.rm-*` leftovers of writers that
are gone: a name whose lock is free has no live writer.

Several directories of one parent that belong together (both sides of a split) are
published as a group by `commit_group`, all or none: their writer holds every name's lock
and builds every temporary directory first; then one rename commits the group, moving its
journal `<parent>/.group-<id>` (the names and their temporary directories, written inside
the first temporary directory) into place; then each name is published as in steps 3-5 and
the journal is deleted. Before the commit, recovery deletes the temporaries as above (none
of the names changed); after it, `recover` of any one of the names rolls the whole group
forward (it takes the other names' locks, and refuses with a one-line error while one of them
is in use), so every reader that recovers first sees all of the group new or all of it as before.
Anyone who can write the parent can plant a journal, so a journal carries an HMAC under the
user's key (`rlpipe.storage.files.user_key`) over the parent's real path, its members and a digest of
each temporary directory (`tree_digest`): one whose signature or digests do not verify is
never rolled forward (nor is any journal when the key cannot be had), and its temporaries are
deleted as a writer's leftovers.

Clean-up stays inside what rlpipe owns. A *root* is a directory rlpipe created or found empty
when it first published there (it writes `.rlpipe-root` into it), or one holding a `.locks`
folder of lock files only (a store written without the marker). Leftovers of other
names are recovered only in a root, and only for names that have a lock file (every rlpipe
writer creates its lock before its first temporary entry). In any other directory (`train
--out /tmp/x`) rlpipe touches only its own name's lock and leftovers. Lock files are opened
without following links and must be small regular files with one name; readers never create
them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import stat
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlpipe.errors import RlpipeError
from rlpipe.storage.files import fsync_path, read_limited, sha256_file, user_key
from rlpipe.storage.names import confined_path as confined_path  # re-exported: sweep and run names are checked in rlpipe.storage.names

LOCK_DIR = ".locks"
ROOT_MARKER = ".rlpipe-root"
ROOT_MARKER_TEXT = "rlpipe publishes here: it may delete its own .tmp-*, .trash-* and .rm-* leftovers in this directory\n"
LOOSE_LOCK_PREFIX = ".rlpipe-lock-"
_MAX_LOCK_BYTES = 64  # a lock file holds one pid line; anything larger is not ours to truncate
TEMP_PREFIX, TRASH_PREFIX, REMOVE_PREFIX = ".tmp-", ".trash-", ".rm-"
_LEFTOVER_RE = re.compile(r"^\.(tmp|trash|rm)-([0-9a-f]{8})-(.+)$")
GROUP_PREFIX = ".group-"  # the journal of a group publish (`commit_group`)
_GROUP_RE = re.compile(r"\.group-[0-9a-f]{8}")
_GROUP_STAGING = ".rlpipe-group"  # the journal before its commit, inside the group's first temporary directory
_DIGESTED_FILE_BYTES = 1 << 20  # files up to this size enter a tree's digest by content (metadata, which hashes the rest)
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


def is_root(parent: Path) -> bool:
    """Whether `parent` is a directory rlpipe publishes into and may clean up: it holds the
    `.rlpipe-root` marker, or (a store or runs folder without the marker) a real `.locks`
    folder that holds nothing but regular `*.lock` files."""
    if _is_regular(parent / ROOT_MARKER):
        return True
    locks = parent / LOCK_DIR
    try:
        if not stat.S_ISDIR(os.lstat(locks).st_mode):
            return False
        with os.scandir(locks) as entries:
            return all(entry.name.endswith(".lock") and entry.is_file(follow_symlinks=False) for entry in entries)
    except OSError:
        return False


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def claim_root(parent: Path) -> None:
    """Make an empty `parent` (one rlpipe just created, or an empty folder the user named) a
    root by writing the marker; a directory that already holds anything is never claimed, so
    concurrent writers agree (the marker is the first entry of a root)."""
    if is_root(parent):
        return
    try:
        with os.scandir(parent) as entries:
            if next(entries, None) is not None:
                return
        fd = os.open(parent / ROOT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:  # claimed by a concurrent writer first, or read-only: not ours to mark
        return
    try:
        os.write(fd, ROOT_MARKER_TEXT.encode())
    finally:
        os.close(fd)


def _lock_location(parent: Path, name: str) -> tuple[Path, str]:
    """The folder and file name of `name`'s lock: `.locks/<name>.lock` in a root, else a
    single `.rlpipe-lock-<name>` file beside the entry (a foreign folder gets no `.locks`)."""
    if is_root(parent):
        return parent / LOCK_DIR, f"{name.lower()}.lock"
    return parent, f"{LOOSE_LOCK_PREFIX}{name.lower()}"


def _open_lock(parent: Path, name: str, create: bool) -> int | None:
    """An open (not yet locked) descriptor of `name`'s lock file; None if it does not exist and
    `create` is false. Never follows a link and never opens anything but a small regular file
    with one name, so a planted link or hard link cannot make a lock write to another file."""
    folder, file = _lock_location(parent, name)
    if create and folder != parent:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder)
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise RlpipeError(f"{folder} is a symbolic link or not a directory; refusing to keep locks there (remove it)") from None
        raise
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(file, flags, 0o644, dir_fd=folder_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_lock(folder / file) from None
        raise
    finally:
        os.close(folder_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > _MAX_LOCK_BYTES:
        os.close(fd)
        raise _not_a_lock(folder / file)
    return fd


def _not_a_lock(path: Path) -> RlpipeError:
    return RlpipeError(f"{path} is not an rlpipe lock file (a link, a special or a large file); refusing to use or change it (remove it)")


def _flock(fd: int) -> bool:
    """Take the lock on `fd` without waiting; False if another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        os.close(fd)
        raise
    return True


def _hold(fd: int) -> int:
    # `_open_lock` checked it is a small regular file with one name: rewriting it touches nothing else.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def try_lock(parent: Path, name: str, create: bool = True) -> int | None:
    """The file descriptor holding `name`'s lock, or None if another process holds it (or,
    without `create`, if no lock file exists: no rlpipe writer ever wrote `name` there)."""
    fd = _open_lock(parent, name, create)
    if fd is None or not _flock(fd):
        if fd is not None:
            os.close(fd)
        return None
    return _hold(fd)


def lock(parent: Path, name: str, what: str) -> int:
    """Take `name`'s lock or raise a one-line error naming the process that holds it."""
    fd = _open_lock(parent, name, create=True)
    assert fd is not None  # created when missing
    if not _flock(fd):
        holder = os.pread(fd, _MAX_LOCK_BYTES, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RlpipeError(
            f"{what} is being written by another process{f' (pid {holder})' if holder else ''}; try again when it has finished"
        )
    return _hold(fd)


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
        match = _LEFTOVER_RE.fullmatch(entry.name)
        if match:
            found.append((match.group(1), _base_name(match.group(3)), Path(entry.path)))
    return found


def _base_name(name: str) -> str:
    """The published name under leftover prefixes: a trash being deleted is `.rm-<id>-.trash-<id>-<name>`."""
    while match := _LEFTOVER_RE.fullmatch(name):
        name = match.group(3)
    return name


def recover(parent: Path, name: str, is_complete: Callable[[Path], bool]) -> None:
    """Finish or roll back an interrupted publish or removal of `name`; the caller holds its lock.

    A committed group publish that names `name` is finished first, for all of its names
    (`commit_group`). A missing `name` with a complete trash beside it is the old version of
    an interrupted replace: it is renamed back. Every other leftover of `name` is deleted.
    """
    _finish_groups(parent, name, is_complete)
    _recover_one(parent, name, is_complete)


def _recover_one(parent: Path, name: str, is_complete: Callable[[Path], bool]) -> None:
    final = parent / name
    mine = [(kind, path) for kind, other, path in _leftovers(parent) if other == name]
    if not os.path.lexists(final):
        for kind, path in mine:
            if kind == "trash" and not path.is_symlink() and is_complete(path):
                os.rename(path, final)
                fsync_path(parent)
                break
    for _, path in mine:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            path.unlink()


def _journals(parent: Path) -> list[tuple[Path, list[tuple[str, str]] | None]]:
    """Every group journal in `parent` with its (name, temporary directory) members, None for
    one that is unreadable (a journal is complete when committed, so that is damage)."""
    try:
        entries = [Path(entry.path) for entry in os.scandir(parent) if _GROUP_RE.fullmatch(entry.name)]
    except OSError:
        return []
    return [(path, _read_journal(path)) for path in entries]


def tree_digest(root: Path) -> str:
    """sha256 over a directory's files: each one's relative path and size, and the content of
    those up to 1 MiB (a dataset's metadata.json, which holds the sha256 of its shards)."""
    digest = hashlib.sha256()
    for directory, folders, files in sorted(os.walk(root)):
        folders.sort()
        for name in sorted(files):
            path = Path(directory) / name
            size = path.lstat().st_size
            content = sha256_file(path) if size <= _DIGESTED_FILE_BYTES and not path.is_symlink() else "-"
            digest.update(f"{path.relative_to(root)}\0{size}\0{content}\n".encode())
    return digest.hexdigest()


def _journal_mac(key: bytes, parent: Path, members: list[dict[str, str | None]]) -> str:
    message = f"{os.path.realpath(parent)}\n{json.dumps(members, sort_keys=True)}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _entry_state(path: Path) -> str | None:
    """What stands at `path`: None when nothing, a directory's `tree_digest`, or "other"."""
    if not os.path.lexists(path):
        return None
    return tree_digest(path) if path.is_dir() and not path.is_symlink() else "other"


def _journal_text(parent: Path, members: list[tuple[str, str]], key: bytes | None) -> str:
    """A group's journal: its members with their temporary directories' digests and the state
    of the entry each replaces (`_entry_state`: a replayed journal finds a newer one), signed."""
    listed = [
        {"name": name, "temp": temp, "digest": tree_digest(parent / temp), "replaces": _entry_state(parent / name)}
        for name, temp in members
    ]
    return json.dumps({"members": listed, "mac": None if key is None else _journal_mac(key, parent, listed)})


def _read_journal(path: Path) -> list[tuple[str, str]] | None:
    """A journal's (name, temporary directory) members; None unless the user's key signed it
    for this folder, every temporary directory still there holds what it held at the commit,
    and the entry it would replace is the one it replaced then, or gone (a journal kept by
    someone and planted again after a newer publish never rolls that back)."""
    key = user_key()
    try:
        data = json.loads(read_limited(path))
    except (OSError, ValueError, RecursionError):
        return None
    raw = data.get("members") if isinstance(data, dict) else None
    if key is None or not isinstance(raw, list) or not raw or not isinstance(data.get("mac"), str):
        return None
    members: list[tuple[str, str]] = []
    for member in raw:
        name, temp = (member.get("name"), member.get("temp")) if isinstance(member, dict) else (None, None)
        match = _LEFTOVER_RE.fullmatch(temp) if isinstance(temp, str) else None
        if not match or match.group(1) != "tmp" or match.group(3) != name or "/" in match.group(3) or match.group(3) in (".", ".."):
            return None  # not one of ours: never rename what it names
        members.append((match.group(3), match.group(0)))
    if not hmac.compare_digest(data["mac"], _journal_mac(key, path.parent, raw)):
        return None  # not written by this user's rlpipe
    for member in raw:
        staged = path.parent / member["temp"]
        if staged.is_dir() and not staged.is_symlink():
            if tree_digest(staged) != member.get("digest"):
                return None  # changed since the commit
            now = _entry_state(path.parent / member["name"])
            if now is not None and ("replaces" not in member or now != member["replaces"]):
                return None  # the entry changed since the commit: a replayed journal
    return members


def _finish_groups(parent: Path, name: str, is_complete: Callable[[Path], bool]) -> None:
    """Roll forward every committed group publish that names `name` (whose lock the caller
    holds), under the locks of its other names: a one-line error if one is in use."""
    for journal, members in _journals(parent):
        names = [member for member, _ in members or []]
        if name not in names:
            continue
        held: list[int] = []
        try:
            for other in sorted(set(names) - {name}):
                fd = try_lock(parent, other, create=False)
                if fd is None:
                    raise RlpipeError(
                        f"an interrupted publish of {', '.join(map(repr, names))} in {parent} cannot be finished while "
                        f"{other!r} is in use by another process; try again"
                    )
                held.append(fd)
            _finish_group(parent, journal, members or [])
            for other in set(names) - {name}:
                _recover_one(parent, other, is_complete)
        except OSError as exc:
            raise RlpipeError(
                f"cannot finish the interrupted publish of {', '.join(map(repr, names))} in {parent}: {exc.strerror or exc}"
            ) from None
        finally:
            for fd in held:
                unlock(fd)


def _finish_group(parent: Path, journal: Path, members: list[tuple[str, str]], faults: bool = False) -> None:
    """Move every member's temporary directory that is still there into place (its old
    version to a trash), delete those trashes, then the journal (the caller holds every lock)."""
    trashes = []
    for i, (name, temp) in enumerate(members):
        staged, final = parent / temp, parent / name
        if staged.is_dir() and not staged.is_symlink():
            if os.path.lexists(final):
                trash = final.with_name(f"{TRASH_PREFIX}{uuid.uuid4().hex[:8]}-{name}")
                os.rename(final, trash)
                trashes.append(trash)
            os.rename(staged, final)
        if faults and i == 0:
            fault_point("group-first-moved")
    fsync_path(parent)
    if faults:
        fault_point("group-moved")
    for trash in trashes:
        delete_directory(trash)
    if faults:
        fault_point("group-trash-deleted")
    journal.unlink(missing_ok=True)
    fsync_path(parent)


def recover_name(parent: Path, name: str, is_complete: Callable[[Path], bool]) -> None:
    """What a reader of `parent/name` does first: `recover` it if rlpipe ever wrote it there (its
    lock file exists) and no writer holds it. Best effort: a read-only directory or a lock
    entry that is not a plain lock file is left as it is; no lock file is ever created."""
    if name in ("", ".", ".."):
        return
    try:
        fd = try_lock(parent, name, create=False)
    except (OSError, RlpipeError):
        return
    if fd is None:
        return
    try:
        recover(parent, name, is_complete)  # a group it cannot finish now is a one-line error: never half a group
    finally:
        unlock(fd)


def recover_all(parent: Path, is_complete: Callable[[Path], bool], skip: str | None = None) -> None:
    """`recover_name` every name with leftovers in `parent`, only if `parent` is a root (see
    `is_root`): in any other folder, entries named like ours may be another program's. A
    group journal none of whose temporary directories is left is then deleted (its group
    was published, or was never committed)."""
    if not is_root(parent):
        return
    for name in sorted({other for _, other, _ in _leftovers(parent)} - {skip}):
        with contextlib.suppress(RlpipeError):  # a group whose other names are in use: whoever holds them finishes it
            recover_name(parent, name, is_complete)
    for journal, members in _journals(parent):
        if not any(os.path.lexists(parent / temp) for _, temp in members or []):
            with contextlib.suppress(OSError):
                journal.unlink()


def delete_directory(path: Path) -> None:
    """Remove a directory so that no reader ever sees it half deleted (rename, then delete);
    a leftover (a trash) is renamed for the name it belonged to, which recovery cleans."""
    doomed = path.with_name(f"{REMOVE_PREFIX}{uuid.uuid4().hex[:8]}-{_base_name(path.name)}")
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
    leftovers of dead writers in the same parent. `check` (e.g. "exists and no --force")
    runs first, before anything is made (so a refused name leaves no parent, root marker or
    lock file behind), and again under the lock before the temporary directory is made.
    """

    def __init__(
        self,
        final: Path,
        what: str,
        is_complete: Callable[[Path], bool],
        check: Callable[[Path], None] | None = None,
    ) -> None:
        if final.name in ("", ".", ".."):
            raise RlpipeError(f"refusing to write {what}: {final} names no entry of a directory (a root, '.' or '..')")
        if check is not None:
            check(final)  # first before anything is made (a parent, a root marker, a lock file); again under the lock
        self.final = final
        self._is_complete = is_complete
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            claim_root(parent)
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


def commit_group(stages: Sequence[StagedDirectory]) -> list[Path]:
    """Publish staged directories of one parent together, all or none (module doc), and
    release their locks. Before the commit a failure leaves them to their `abort`; after it
    they are published, by this process or by the next one that recovers one of their names."""
    if len(stages) == 1:
        return [stages[0].commit()]
    parent = stages[0].final.parent
    if any(stage.final.parent != parent for stage in stages) or len({stage.final.name.lower() for stage in stages}) < len(stages):
        raise ValueError("a group publishes entries of one directory whose names differ in more than case")
    check_interrupted()
    for stage in stages:
        fsync_tree(stage.path)
    fault_point("group-synced")
    members = [(stage.final.name, stage.path.name) for stage in stages]
    staging, journal = stages[0].path / _GROUP_STAGING, parent / f"{GROUP_PREFIX}{uuid.uuid4().hex[:8]}"
    text = _journal_text(parent, members, user_key())
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(staging, journal)  # the commit
    try:
        fsync_path(parent)
        fsync_path(stages[0].path)
        fault_point("group-committed")
        _finish_group(parent, journal, members, faults=True)
    except BaseException:
        # committed: finish now if possible (a signal, a transient error), never roll back; if
        # that fails too, the next process that recovers one of the names finishes it
        with contextlib.suppress(BaseException):
            _finish_group(parent, journal, members)
        raise
    finally:
        for stage in stages:
            stage._release()
    return [stage.final for stage in stages]
