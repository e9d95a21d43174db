"""Resumable runs: the full training state saved every ``config.checkpoint_every`` units
and picked up again by a run of the same config in the same directory.

The state (networks, optimisers, samplers and generators, the replay buffer, the vector
env with its sub-envs' RNGs (:meth:`rlpipe.envs.stepper.VecStepper.state_dict`),
Python/NumPy/torch RNG states, the loop's counters and the run's eval history) goes to
``resume.pt`` in one atomic replace; ``resume.json`` names the algorithm and config, which
is what ``rlpipe train --resume RUN_DIR`` reads. Both live in :func:`resume_dir`. A state is only loaded by a run whose config
equals the saved one, so resuming gives what an uninterrupted run of that config gives
(a run is a function of its config on one machine). The files are removed when the run
finishes.
"""

from __future__ import annotations

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

from rlpipe.errors import RlpipeError
from rlpipe.files import atomic_output, atomic_write_text
from rlpipe.training.run import Run

STATE_FILE = "resume.pt"
INFO_FILE = "resume.json"


def rng_states() -> dict[str, Any]:
    """Python's, NumPy's global and torch's CPU RNG states, and CUDA's once a run used CUDA."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
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
    """What ``rlpipe train --resume RUN_DIR`` needs: ``{"algo", "config"}`` of the interrupted run."""
    path = resume_dir(run_dir) / INFO_FILE
    if not path.is_file():
        raise RlpipeError(f"{run_dir} holds no resumable state (train with --checkpoint-every N to write one)")
    return json.loads(path.read_text())


def state_of(obj: Any) -> Any:
    """``obj``'s state for ``torch.save`` (not a copy: save it at once): a tensor's values, a
    generator's state, or ``state_dict()`` (modules, optimisers, samplers, replay buffers, steppers)."""
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


class Checkpointer:
    """Saves and restores the full state of one run's loop.

    ``objects`` are tensors, torch or NumPy generators, or anything with
    ``state_dict``/``load_state_dict`` (modules, optimisers, samplers, replay buffers, the
    env stepper). Without ``config.checkpoint_every`` or an output directory it does nothing.
    """

    def __init__(self, run: Run, objects: Mapping[str, Any]) -> None:
        self.run, self.objects = run, objects
        self.every = getattr(run.config, "checkpoint_every", None)
        self.config = json.loads(json.dumps(asdict(run.config)))
        self.dir = resume_dir(run.out_dir) if self.every is not None and run.out_dir is not None else None
        self.next_save = self.every or 0

    def restore(self) -> dict[str, Any] | None:
        """Load a saved state of this config into the objects, RNGs and run; returns the
        loop's counters, or None when there is nothing to resume."""
        if self.dir is None or not (self.dir / STATE_FILE).is_file():
            return None
        state = torch.load(self.dir / STATE_FILE, weights_only=False)  # our own file, written by save()
        if state["config"] != self.config:
            return None
        for name, obj in self.objects.items():
            load_state(obj, state["objects"][name])
        set_rng_states(state["rng"])
        self.run.restore(state["run"])
        self.next_save = state["next_save"]
        return state["loop"]

    def maybe_save(self, done: int, loop: Mapping[str, Any]) -> None:
        """Save once ``done`` passed the next checkpoint point; ``loop`` holds the loop's counters."""
        if self.dir is None or done < self.next_save:
            return
        while self.next_save <= done:
            self.next_save += self.every
        state = {"config": self.config, "objects": {name: state_of(obj) for name, obj in self.objects.items()},
                 "rng": rng_states(), "run": self.run.state(), "next_save": self.next_save, "loop": dict(loop)}
        self.dir.mkdir(parents=True, exist_ok=True)
        with atomic_output(self.dir / STATE_FILE) as tmp:
            torch.save(state, tmp)
        atomic_write_text(self.dir / INFO_FILE, json.dumps({"algo": self.run.algo, "config": self.config}, indent=2) + "\n")

    def discard(self) -> None:
        """Remove the saved state (the run finished)."""
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["Checkpointer", "INFO_FILE", "STATE_FILE", "load_state", "read_resume_info", "resume_dir", "rng_states",
           "set_rng_states", "state_of"]
