"""Resumable runs: the full training state saved every ``config.checkpoint_every`` units
and picked up again by a run of the same config in the same directory.

The state (networks, optimisers, samplers and generators, the replay buffer, the vector
env with its sub-envs' RNGs (:meth:`rlpipe.envs.stepper.VecStepper.state_dict`),
Python/NumPy/torch RNG states, the loop's counters and the run's eval history) goes to
``resume.safetensors`` in one atomic replace: its tensors (NumPy arrays among them, dtype
kept) as the file's tensors, the rest as JSON in its header (``config``, and ``state``: the
state tree, whose tensors and arrays are references to tensor names), with a sha256 over
both. ``resume.json`` names the algorithm and config, which is what ``rlpipe train
--resume RUN_DIR`` reads (and checks against the state's config). Both live in :func:`resume_dir`.

Nothing is unpickled: the header is read first and a state is only loaded by a run whose
config equals the saved one (so resuming gives what an uninterrupted run of that config
gives: a run is a function of its config on one machine); the tensors are read after that
and checked against the sha256; the JSON builds only dicts, lists, tuples, numbers and
strings, and arrays and tensors of plain dtypes. A file that cannot be read that way is an
RlpipeError. A ``resume.pt`` (the pickle format of older versions) is never read. The
files are removed when the run finishes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from rlpipe.errors import RlpipeError
from rlpipe.storage.files import atomic_output, atomic_write_text
from rlpipe.training import distributed
from rlpipe.training.run import Run

STATE_FILE = "resume.safetensors"
INFO_FILE = "resume.json"
LEGACY_STATE_FILE = "resume.pt"  # a pickle: never read
FORMAT = "rlpipe-resume-1"
MAX_INFO_BYTES = 1 << 24  # resume.json holds a config: far less
# Config fields that do not change what a run computes: a state resumes whatever they hold
# (and states saved before a field was added, which lack it).
NOT_COMPARED = frozenset({"loggers"})


def rng_states() -> dict[str, Any]:
    """Python's, NumPy's global and torch's CPU RNG states, and CUDA's once a run used CUDA."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(legacy=False), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():  # asking otherwise would start CUDA in a CPU run
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def resume_dir(run_dir: str | os.PathLike) -> Path:
    """Where a run's resumable state lives: a hidden sibling of the run directory, because the
    run directory itself is only published (renamed into place) when the run finishes."""
    run_dir = Path(run_dir)
    return run_dir.parent / f".resume-{run_dir.name}"


def read_resume_info(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What ``rlpipe train --resume RUN_DIR`` needs: ``{"algo", "config"}`` of the interrupted
    run; an RlpipeError when there is no saved state or the record is malformed."""
    directory = resume_dir(run_dir)
    path = directory / INFO_FILE
    if not path.is_file():
        raise RlpipeError(f"{run_dir} holds no resumable state (train with --checkpoint-every N to write one)")
    if not (directory / STATE_FILE).is_file():
        legacy = (directory / LEGACY_STATE_FILE).exists()
        raise RlpipeError(
            f"{run_dir} holds no resumable state"
            + (
                f" ({directory / LEGACY_STATE_FILE} is a pickle of an older rlpipe, which is never loaded: train the run afresh)"
                if legacy
                else f" (missing {directory / STATE_FILE})"
            )
        )
    if path.stat().st_size > MAX_INFO_BYTES:
        raise RlpipeError(f"{path} is larger than a resume record can be ({MAX_INFO_BYTES} bytes)")
    try:
        info = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RlpipeError(f"{path} is not valid JSON ({exc})") from None
    config = info.get("config") if isinstance(info, dict) else None
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("algo"), str)
        or not isinstance(config, dict)
        or not isinstance(config.get("env_id"), str)
        or type(config.get("checkpoint_every")) is not int
    ):
        raise RlpipeError(f'{path} is not a resume record ({{"algo": NAME, "config": {{"env_id": ID, "checkpoint_every": N, ...}}}}}}}})')
    if saved_config(directory / STATE_FILE) != config:  # else the run would silently start afresh
        raise RlpipeError(f"{path} and {STATE_FILE} name different configs: there is no state of this run to resume")
    return info


def state_of(obj: Any) -> Any:
    """``obj``'s state for :class:`Checkpointer` (not a copy: save it at once): a tensor's
    values, a generator's state, or ``state_dict()`` (modules, optimisers, samplers, replay
    buffers, steppers)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, np.random.Generator):
        return obj.bit_generator.state
    return obj.state_dict()


@torch.no_grad()
def load_state(obj: Any, state: Any) -> None:
    """Put a :func:`state_of` snapshot back into ``obj`` (in place: the loop keeps its references)."""
    if isinstance(obj, torch.Tensor):
        obj.copy_(state)
    elif isinstance(obj, torch.Generator):
        obj.set_state(state)
    elif isinstance(obj, np.random.Generator):
        obj.bit_generator.state = state
    else:
        obj.load_state_dict(state)


# A state tree in JSON: None, bools, numbers, strings and lists are themselves; every JSON
# object is one tagged node: {"tuple": [...]}, {"items": [[key, value], ...]} (a dict; keys
# are strings or ints, e.g. an optimiser's parameter indices), {"tensor": NAME},
# {"array": NAME} or {"scalar": NAME} (a torch tensor, a NumPy array or a NumPy scalar, held
# as the file's tensor NAME).
class _Malformed(Exception):
    """The state tree is not one that :func:`_encode` writes."""


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """``value`` as a JSON node; its tensors and arrays are added to ``tensors`` (copied to the CPU)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [_encode(item, tensors, f"{path}.{i}") for i, item in enumerate(value)]
    if type(value) is tuple:
        return {"tuple": [_encode(item, tensors, f"{path}.{i}") for i, item in enumerate(value)]}
    if isinstance(value, Mapping) and all(type(key) in (str, int) for key in value):
        return {"items": [[key, _encode(item, tensors, f"{path}.{key}")] for key, item in value.items()]}
    if isinstance(value, torch.Tensor):
        return {"tensor": _add(tensors, path, value.detach().to("cpu", copy=True).contiguous())}
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biuf":
        array = np.array(value, dtype=value.dtype.newbyteorder("="), order="C", ndmin=0)  # a copy, in native order
        try:
            tensor = torch.from_numpy(array)
        except TypeError:  # a dtype torch lacks (e.g. float128)
            tensor = None
        if tensor is not None:
            return {"array" if isinstance(value, np.ndarray) else "scalar": _add(tensors, path, tensor)}
    raise RlpipeError(f"the training state cannot be saved for resuming: {path} is a {type(value).__qualname__}")


def _add(tensors: dict[str, torch.Tensor], path: str, tensor: torch.Tensor) -> str:
    name = path if path not in tensors else f"{path}#{len(tensors)}"
    tensors[name] = tensor
    return name


def _decode(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The value :func:`_encode` wrote as ``node``; :class:`_Malformed` for anything else."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_decode(item, tensors) for item in node]
    if type(node) is not dict or len(node) != 1:
        raise _Malformed(f"a JSON object with keys {sorted(node) if type(node) is dict else node!r}")
    ((tag, body),) = node.items()
    if tag == "tuple" and type(body) is list:
        return tuple(_decode(item, tensors) for item in body)
    if (
        tag == "items"
        and type(body) is list
        and all(type(pair) is list and len(pair) == 2 and type(pair[0]) in (str, int) for pair in body)
    ):
        return {key: _decode(item, tensors) for key, item in body}
    if tag in ("tensor", "array", "scalar") and type(body) is str and body in tensors:
        tensor = tensors[body]
        if tag == "tensor":
            return tensor
        array = tensor.numpy()  # TypeError for a dtype NumPy lacks (bfloat16): never written as an array
        return array if tag == "array" else array[()]
    raise _Malformed(f"a {tag!r} node that is not one")


def _digest(header: Mapping[str, str], tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the header's config and state and every tensor's name, dtype, shape and bytes."""
    h = hashlib.sha256(json.dumps([FORMAT, header["config"], header["state"]]).encode())
    for name in sorted(tensors):
        tensor = tensors[name]
        h.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]  # ndarray: a buffer numpy stubs omit
    return h.hexdigest()


def write_state(path: Path, config: dict[str, Any], state: Mapping[str, Any]) -> None:
    """Write ``state`` (a tree of the kinds :func:`_encode` takes) for ``config`` to ``path`` atomically."""
    tensors: dict[str, torch.Tensor] = {}
    header = {"format": FORMAT, "config": json.dumps(config), "state": json.dumps(_encode(state, tensors, "state"))}
    header["sha256"] = _digest(header, tensors)
    with atomic_output(path, write_through=False) as tmp:
        save_file(tensors, str(tmp), metadata=header)


# What reading a state file that is not one raises: the parser's errors and the JSON's.
_READ_ERRORS = (SafetensorError, OSError, ValueError, TypeError, RecursionError, _Malformed)


def _fix(path: Path) -> str:
    return f"remove {path.parent} to train afresh"


def _header(f: Any, path: Path) -> dict[str, str]:
    """An open state file's header (JSON strings; reading it reads no tensor)."""
    header = f.metadata() or {}
    if header.get("format") != FORMAT or not {"config", "state", "sha256"} <= set(header):
        raise RlpipeError(f"{path} is not an rlpipe resume state ({_fix(path)})")
    return header


def saved_config(path: Path) -> Any:
    """The config the state in ``path`` was saved for (read from the header only)."""
    try:
        with safe_open(path, framework="pt") as f:
            return json.loads(_header(f, path)["config"])
    except _READ_ERRORS as exc:
        raise RlpipeError(f"{path} is not a readable resume state ({_one_line(exc)}; {_fix(path)})") from None


def read_state(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The state :func:`write_state` wrote to ``path``, or None when it was saved for another
    config; an RlpipeError when the file is not one (unreadable, truncated, altered)."""
    try:
        with safe_open(path, framework="pt") as f:
            header = _header(f, path)
            if not _same_run(json.loads(header["config"]), config):  # before any tensor is read
                return None
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  (safe_open is not iterable)
        if _digest(header, tensors) != header["sha256"]:
            raise RlpipeError(f"{path} does not match its sha256: the state is damaged ({_fix(path)})")
        state = _decode(json.loads(header["state"]), tensors)
    except _READ_ERRORS as exc:
        raise RlpipeError(f"{path} is not a readable resume state ({_one_line(exc)}; {_fix(path)})") from None
    if not isinstance(state, dict) or not {"objects", "rng", "run", "next_save", "loop"} <= set(state):
        raise RlpipeError(f"{path} is not a readable resume state (its state lacks parts; {_fix(path)})")
    return state


def _same_run(saved: Any, config: Mapping[str, Any]) -> bool:
    """Whether a state saved for config ``saved`` continues a run of ``config`` (apart from :data:`NOT_COMPARED`)."""
    if not isinstance(saved, dict):
        return False
    return {k: v for k, v in saved.items() if k not in NOT_COMPARED} == {k: v for k, v in config.items() if k not in NOT_COMPARED}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Checkpointer:
    """Saves and restores the full state of one run's loop.

    ``objects`` are tensors, torch or NumPy generators, or anything with
    ``state_dict``/``load_state_dict`` (modules, optimisers, samplers, replay buffers, the
    env stepper) whose states are trees of dicts, lists, tuples, numbers, strings, tensors
    and NumPy arrays. Without ``config.checkpoint_every`` or an output directory it does nothing.
    """

    def __init__(self, run: Run, objects: Mapping[str, Any], out_dir: str | os.PathLike | None = None) -> None:
        self.run, self.objects = run, objects
        self.every = getattr(run.config, "checkpoint_every", None)
        self.config = json.loads(json.dumps(asdict(run.config)))
        # A data-parallel run's other ranks write no run directory (run.out_dir is None) but
        # resume from rank 0's state: they name its directory as ``out_dir``.
        out_dir = run.out_dir if out_dir is None else out_dir
        self.dir = resume_dir(out_dir) if self.every is not None and out_dir is not None else None
        self.ranks = distributed.ranks()
        self.next_save = self.every or 0

    def _state(self, rng: dict[str, Any] | list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {
            "objects": {name: state_of(obj) for name, obj in self.objects.items()},
            "rng": rng_states() if rng is None else rng,
            "run": self.run.state(),
            "next_save": self.next_save,
        }

    def restore(self) -> dict[str, Any] | None:
        """Load a saved state of this config into the objects, RNGs and run; returns the
        loop's counters, or None when there is nothing to resume. First checks that the
        state can be saved at all (an env holding native handles cannot: an RlpipeError
        before any training)."""
        if self.dir is None:
            return None
        _encode(self._state(), {}, "state")
        path = self.dir / STATE_FILE
        state = read_state(path, self.config) if path.is_file() else None
        if state is None:
            return None
        if type(state["next_save"]) is not int or type(state["loop"]) is not dict:
            raise RlpipeError(f"{path} does not fit this run (its loop counters are malformed)")
        try:
            for name, obj in self.objects.items():
                load_state(obj, state["objects"][name])
            set_rng_states(self._rank_rng(state["rng"]))
            self.run.restore(state["run"])
        except RlpipeError as exc:
            raise RlpipeError(f"{path}: {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
            raise RlpipeError(f"{path} does not fit this run ({_one_line(exc)})") from None
        self.next_save = state["next_save"]
        return state["loop"]

    def maybe_save(self, done: int, loop: Mapping[str, Any]) -> None:
        """Save once ``done`` passed the next checkpoint point; ``loop`` holds the loop's counters."""
        if self.dir is None or done < self.next_save:
            return
        assert self.every is not None  # a resume dir is set only with checkpoint_every
        while self.next_save <= done:
            self.next_save += self.every
        rng: dict[str, Any] | list[Any] | None = rng_states()
        if self.ranks.parallel:  # every rank's RNGs, in rank order, saved by rank 0
            rng = distributed.gather_to_main(rng)
            if not self.ranks.main:
                return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_state(self.dir / STATE_FILE, self.config, {**self._state(rng), "loop": dict(loop)})
        atomic_write_text(
            self.dir / INFO_FILE, json.dumps({"algo": self.run.algo, "config": self.config}, indent=2) + "\n", write_through=False
        )

    def discard(self) -> None:
        """Remove the saved state (the run finished)."""
        if self.dir is not None and self.ranks.main:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _rank_rng(self, saved: Any) -> Any:
        """This rank's RNG states from a saved state: a data-parallel run saved one per rank."""
        if not isinstance(saved, list):
            return saved
        if len(saved) != self.ranks.size:
            raise RlpipeError(f"the state was saved by {len(saved)} processes, not {self.ranks.size}")
        return saved[self.ranks.rank]


__all__ = [
    "Checkpointer",
    "INFO_FILE",
    "LEGACY_STATE_FILE",
    "STATE_FILE",
    "load_state",
    "read_resume_info",
    "read_state",
    "resume_dir",
    "rng_states",
    "saved_config",
    "set_rng_states",
    "state_of",
    "write_state",
]
