"""Names of datasets, runs and sweeps: one pattern, checked in one place.

A name is 1 to 128 characters of ASCII letters, digits, `.`, `_` and `-`, starting with a
letter or digit (`NAME_PATTERN`, matched against the whole name, so a trailing newline or
any other control character is refused), with no `..` and none of the names Windows
reserves for devices (`CON`, `NUL`, `COM1`, ..., with or without an extension). An empty
name is refused, never replaced by a default. Two names of one command that differ only in
case are refused (they would collide on case-insensitive file systems).

Dataset names are one such name (a directory of the store). Sweep and run names may nest:
`group/exp` is a relative path each of whose `/`-separated parts is a name, so it stays
inside its root (`confined_path`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from rlpipe.errors import RlpipeError

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_NAME_RE = re.compile(NAME_PATTERN)
# Names Windows reserves for devices, with or without an extension.
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
_RULE = "use 1 to 128 letters, digits, '-', '_' and '.', starting with a letter or digit, without '/' or '..'"


def name_problem(name: str) -> str | None:
    """What is wrong with `name` as a dataset, run or sweep name, or None."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        return _RULE
    if name.split(".")[0].upper() in _RESERVED:
        return f"{name.split('.')[0]} is a reserved device name on Windows"
    return None


def check_name(name: str, what: str) -> str:
    """Return `name` if it is a valid name (module doc), else raise a one-line RlpipeError
    naming `what` ("dataset name", "sweep name", ...)."""
    problem = name_problem(name)
    if problem:
        raise RlpipeError(f"invalid {what} {name!r}: {problem}")
    return name


def confined_path(root: str | os.PathLike, relative: str, what: str, option: str | None = None) -> Path:
    """`root / relative` for a relative path each of whose `/`-separated parts is a valid
    name (so it stays under `root`: no absolute path, no empty, `.` or `..` part), else an
    RlpipeError naming `what` (sweep and run names). `option`: `relative` is a default built
    from other input (`ALGO-ENV`), and the error asks for that option instead."""
    problem = next(filter(None, map(name_problem, relative.split("/"))), None)  # an absolute path starts with an empty part
    if problem and option:
        raise RlpipeError(f"the default {what} {relative!r} is not a valid name ({problem}); give {option}")
    if problem:
        raise RlpipeError(
            f"invalid {what} {relative!r}: it must be a relative path inside {root} whose every '/'-separated part is a name ({problem})"
        )
    return Path(root, *relative.split("/"))


def check_distinct(names: Sequence[str], what: str) -> None:
    """Refuse names of one command that are equal or differ only in case."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.lower(), name)
        if other == name and names.count(name) > 1:
            raise RlpipeError(f"the {what}s {', '.join(map(repr, names))} must differ")
        if other != name:
            raise RlpipeError(f"the {what}s {other!r} and {name!r} differ only in case; choose names that differ in more than case")


__all__ = ["NAME_PATTERN", "check_distinct", "check_name", "confined_path", "name_problem"]
