"""A vector env's state as plain data, for resumable runs: nothing is pickled, and loading
builds no object from the saved data.

:func:`env_state` walks a live vector env through ``vars()``: its own attributes and, as
deep as they go, those of its sub-envs, wrappers and spaces. It records plain data
(``None``, bools, numbers, strings, NumPy arrays and scalars of bool, integer or float
dtype, and lists, tuples and dicts of these) and the state of each NumPy generator (its
bit generator's state dict). Configuration that stepping never changes (dtypes, enums,
env specs, functions, and containers holding them) is skipped. The result is plain data
itself: each recorded value is a tagged tuple (see :func:`_node`).

:func:`load_env_state` puts that record back into a vector env built afresh the same way:
plain data goes only to attributes that exist there holding plain data (an env may change
an array's dtype or a ``None`` to a number as it steps), generators get their states back, and the record must name
exactly the attributes the live env has. Restoring is exact for envs whose state is
Python and NumPy data (classic control, GoalWorld, the time-limit, order and checker
wrappers): each sub-env's physical state, step counters and ``np_random`` generator, the
vector env's pending autoresets. An array that two attributes share comes back as two
copies (none of those envs shares one).

An env holding anything else (a native handle such as a Box2D world or a MuJoCo model, the
worker processes of an AsyncVectorEnv, an object of an unknown class) cannot be captured
this way and is refused with an RlpipeError naming the attribute.
"""

from __future__ import annotations

import enum
import functools
import types
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from rlpipe.errors import RlpipeError

# What a saved generator may be rebuilt with (a space's generator is created on first use,
# so the live one can still be None): NumPy's own bit generators, by name.
_BIT_GENERATORS = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "MT19937": np.random.MT19937,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
}
_CONSTANTS = (np.dtype, enum.Enum, EnvSpec, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)
_OBJECTS = (gym.Env, gym.vector.VectorEnv, gym.spaces.Space)


def _is_plain(value: Any) -> bool:
    """Plain data: what a resume file stores and gives back (exact types, so enums and
    other subclasses of int or str are not plain)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype.kind in "biuf"
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple):
        return all(_is_plain(item) for item in value)
    if type(value) is dict:
        return all(type(key) in (str, int) and _is_plain(item) for key, item in value.items())
    return False


def _is_constant(value: Any) -> bool:
    """Configuration that stepping never changes, or a container of it and plain data (an env's ``metadata``)."""
    if isinstance(value, _CONSTANTS):
        return True
    if type(value) is dict and not all(type(key) in (str, int) for key in value):
        return False
    items = list(value.values()) if type(value) is dict else value if type(value) in (list, tuple) else []
    constant = [not _is_plain(item) for item in items]
    return any(constant) and all(_is_constant(item) for item, c in zip(items, constant) if c)


def _is_object_container(value: Any) -> bool:
    """A non-empty list, tuple or dict of envs or spaces (a vector env's sub-envs, a Dict space's spaces)."""
    items: Any = list(value.values()) if type(value) is dict else value if type(value) in (list, tuple) else None
    return bool(items) and all(isinstance(item, _OBJECTS) for item in items)


def _items(container: list | tuple | dict) -> list[tuple[Any, Any]]:
    return list(container.items()) if type(container) is dict else list(enumerate(container))


def _is_recorded(value: Any) -> bool:
    """Whether :func:`_node` records ``value`` (what it skips is configuration)."""
    return _is_plain(value) or isinstance(value, (np.random.Generator, *_OBJECTS)) or _is_object_container(value) or not _is_constant(value)


def _node(value: Any, path: str, seen: set[int]) -> tuple:
    """The record of one attribute's value: ``("value", data)``, ``("generator", state)``,
    ``("object", {name: record})`` for an env, wrapper or space, ``("objects", [records] or
    {key: record})`` for a container of them, ``("shared",)`` for an object already recorded
    elsewhere in the walk."""
    if _is_plain(value):
        return ("value", value)
    if isinstance(value, np.random.Generator):
        return ("generator", value.bit_generator.state)
    if isinstance(value, _OBJECTS):
        if id(value) in seen:
            return ("shared",)
        seen.add(id(value))
        return ("object", {name: _node(item, f"{path}.{name}", seen) for name, item in _recorded(value)})
    if _is_object_container(value):
        nodes = [(key, _node(item, f"{path}[{key!r}]", seen)) for key, item in _items(value)]
        return ("objects", dict(nodes) if type(value) is dict else [node for _, node in nodes])
    raise RlpipeError(
        f"the env's state cannot be saved for resuming: {path} is a {type(value).__qualname__} "
        "(only plain data, NumPy generators, envs, wrappers and spaces can be)"
    )


def _recorded(obj: Any) -> list[tuple[str, Any]]:
    """``obj``'s attributes that its record holds, in ``vars()`` order."""
    return [(name, value) for name, value in vars(obj).items() if _is_recorded(value)]


def env_state(envs: gym.vector.VectorEnv) -> tuple:
    """``envs``' state as plain data (the module docstring says what is recorded); an
    RlpipeError when some part of it cannot be recorded that way."""
    return _node(envs, type(envs).__name__, set())


def load_env_state(envs: gym.vector.VectorEnv, state: Any) -> None:
    """Put :func:`env_state`'s record back into ``envs`` (built like the env it came from);
    an RlpipeError when the record does not fit ``envs``."""
    _load(envs, state, type(envs).__name__, set())


def _mismatch(path: str, what: str) -> RlpipeError:
    return RlpipeError(f"the saved env state does not fit this env: {path} {what}")


def _tagged(node: Any, path: str) -> tuple[str, Any]:
    """A record's kind and body, checked to be one of :func:`_node`'s forms."""
    size = {"value": 2, "generator": 2, "object": 2, "objects": 2, "shared": 1}
    if type(node) is not tuple or not node or type(node[0]) is not str or len(node) != size.get(node[0]):
        raise _mismatch(path, "is not a recorded value")
    return node[0], (node[1] if len(node) == 2 else None)


def _load(live: Any, node: Any, path: str, seen: set[int]) -> None:
    """Check ``node`` against the live env, wrapper or space ``live`` and load it into its attributes."""
    kind, body = _tagged(node, path)
    if not isinstance(live, _OBJECTS) or kind not in ("object", "shared"):
        raise _mismatch(path, f"is a {type(live).__name__}, recorded as {kind}")
    if (kind == "shared") != (id(live) in seen):
        raise _mismatch(path, "is shared with another attribute on one side only")
    if kind == "shared":
        return
    seen.add(id(live))
    names = [name for name, _ in _recorded(live)]  # the live order: shared objects are met as when recorded
    if type(body) is not dict or set(body) != set(names):
        other = set(body) if type(body) is dict else set()
        raise _mismatch(path, f"has attributes {sorted(set(names) ^ other)} on one side only")
    for name in names:
        _load_attribute(vars(live), name, body[name], f"{path}.{name}", seen)


def _load_attribute(attributes: dict[str, Any], name: str, node: Any, path: str, seen: set[int]) -> None:
    live = attributes[name]
    kind, body = _tagged(node, path)
    if kind == "value":
        if not _is_plain(live) or not _is_plain(body):
            raise _mismatch(path, "holds plain data on one side only")
        attributes[name] = body  # into the instance dict: no property setter or __setattr__ runs
    elif kind == "generator":
        if live is None and type(body) is dict and body.get("bit_generator") in _BIT_GENERATORS:
            live = attributes[name] = np.random.Generator(_BIT_GENERATORS[body["bit_generator"]]())
        if not isinstance(live, np.random.Generator):
            raise _mismatch(path, "holds a generator on one side only")
        try:
            live.bit_generator.state = body
        except (TypeError, ValueError, KeyError) as exc:
            raise _mismatch(path, f"has an invalid generator state ({exc})") from None
    elif kind == "objects":
        keys = [key for key, _ in _items(live)] if _is_object_container(live) else None
        recorded = list(body) if type(body) is dict else list(range(len(body))) if type(body) is list else None
        if (
            keys is None
            or recorded is None
            or sorted(map(repr, keys)) != sorted(map(repr, recorded))
            or (type(body) is dict) != (type(live) is dict)
        ):
            raise _mismatch(path, "holds envs or spaces on one side only")
        for key, item in _items(live):
            _load(item, body[key], f"{path}[{key!r}]", seen)
    else:
        _load(live, node, path, seen)


__all__ = ["env_state", "load_env_state"]
