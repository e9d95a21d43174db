"""Collecting datasets from gymnasium vector envs with any batched policy.

The hot loop does one vector-env step and a handful of array copies per step: rows go into
a staging buffer in time-major order, and completed episodes are sorted out of it in bulk
(one lexsort per flush), so there is no per-step or per-env Python bookkeeping.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.errors import RlpipeError
from rlpipe.envs import make_vec_env
from rlpipe.envs.stepper import StepBatch, VecStepper

RowSink = Callable[[dict[str, Columnar]], None]


class Policy(Protocol):
    """Anything mapping a batch of observations (one row per env) to a batch of env actions."""

    def __call__(self, obs: Columnar) -> np.ndarray: ...


class RandomPolicy:
    """Uniform random actions for a batch of envs, from its own seeded generator."""

    def __init__(self, action_space: gym.Space, num_envs: int, seed: int = 0) -> None:
        self.space = action_space
        self.num_envs = num_envs
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: Columnar) -> np.ndarray:
        space, n = self.space, self.num_envs
        if isinstance(space, gym.spaces.Discrete):
            return space.start + self.rng.integers(space.n, size=n)
        if isinstance(space, gym.spaces.Box):
            low = np.where(np.isfinite(space.low), space.low, -1.0)
            high = np.where(np.isfinite(space.high), space.high, 1.0)
            return self.rng.uniform(low, high, size=(n,) + space.shape).astype(space.dtype)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return space.start + (self.rng.random((n,) + space.shape) * space.nvec).astype(np.int64)
        if isinstance(space, gym.spaces.MultiBinary):
            return self.rng.integers(2, size=(n,) + tuple(space.shape), dtype=np.int8)
        raise RlpipeError(f"random policy does not support action space {space!r}")


class EpisodeAssembler:
    """Turns batched env steps into rows of whole episodes, sorted by (episode_id, step).

    Episode ids are given in order of completion (ties by env index), so they are
    deterministic and increase through the output. Rows of unfinished episodes wait in the
    staging buffer; they are dropped at `close`. At most `max_episodes` episodes are emitted.

    Args:
        num_envs: batch size of every `add_step` call.
        sink: receives each flushed block of rows (e.g. `DatasetWriter.write`).
        max_episodes: stop assigning ids after this many episodes.
        capacity: initial staging rows; doubled when unfinished episodes fill half of it.
    """

    def __init__(self, num_envs: int, sink: RowSink, max_episodes: int | None = None, capacity: int = 1 << 16) -> None:
        self.num_envs = num_envs
        self.sink = sink
        self.max_episodes = max_episodes
        self.capacity = max(capacity, 4 * num_envs)
        self.episodes_done = 0
        self.steps_done = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self._buffers: dict[str, Columnar] | None = None
        self._size = 0
        self._env_key = np.arange(num_envs, dtype=np.int64)
        self._next_key = num_envs
        self._done_keys: list[np.ndarray] = []

    def add_step(self, step: StepBatch) -> None:
        """Record one vector-env step (a :data:`~rlpipe.envs.stepper.StepSink`); rows where
        ``valid`` is False (autoreset steps) are dropped.

        All rows are copied as they come (slices, no fancy indexing); invalid rows get the
        key -1, which never completes, so `flush` discards them in bulk.
        """
        row = {
            "key": np.where(step.valid, self._env_key, -1),
            "step": step.episode_length - 1,  # the row's index in its episode (valid rows)
            "obs": step.obs,
            "action": np.asarray(step.env_actions),
            "reward": np.asarray(step.rewards),
            "next_obs": step.next_obs,
            "terminated": np.asarray(step.terminated),
            "truncated": np.asarray(step.truncated),
        }
        if self._buffers is None:
            self._buffers = {k: map_columnar(v, lambda a: np.empty((self.capacity,) + a.shape[1:], a.dtype)) for k, v in row.items()}
        if self._size + self.num_envs > self.capacity:
            self.flush()
        self._store(row, self._size)
        self._size += self.num_envs

        finished = np.flatnonzero(step.finished)
        if len(finished):
            kept = finished if self.max_episodes is None else finished[: max(self.max_episodes - self.episodes_done, 0)]
            self._done_keys.append(self._env_key[kept].copy())
            self.episodes_done += len(kept)
            self.steps_done += int(step.episode_length[kept].sum())
            self.recent_returns.extend(step.episode_return[kept].tolist())
            self._env_key[finished] = self._next_key + np.arange(len(finished))
            self._next_key += len(finished)

    def _store(self, values: dict[str, Columnar], at: int) -> None:
        def put(buffer: Columnar, value: Columnar) -> None:
            if isinstance(buffer, dict):
                for key in buffer:
                    put(buffer[key], value[key])
            else:
                buffer[at : at + len(value)] = value

        for name, value in values.items():
            put(self._buffers[name], value)

    def flush(self) -> None:
        """Emit the rows of every completed episode; keep unfinished ones (growing if needed)."""
        if self._buffers is None or self._size == 0:
            return
        size, buffers = self._size, self._buffers
        keys = buffers["key"][:size]
        if self._done_keys:
            done_keys = np.concatenate(self._done_keys)
            first_id = self.episodes_done - len(done_keys)
            sorter = np.argsort(done_keys, kind="stable")
            position = np.searchsorted(done_keys, keys, sorter=sorter)
            position = np.minimum(position, len(done_keys) - 1)
            complete = done_keys[sorter[position]] == keys
            rows = np.flatnonzero(complete)
            episode_id = first_id + sorter[position[rows]]
            order = np.lexsort((buffers["step"][rows], episode_id))
            rows, episode_id = rows[order], episode_id[order]
            self._done_keys = []
            out = {name: map_columnar(buffers[name], lambda a: a[rows]) for name in buffers if name != "key"}
            out["episode_id"] = episode_id
            self.sink(out)
            keep = np.flatnonzero(~complete & (keys >= 0))
        else:
            keep = np.flatnonzero(keys >= 0)
        kept = {name: map_columnar(buffers[name], lambda a: a[keep]) for name in buffers}
        if len(keep) > self.capacity // 2:
            self.capacity *= 2
            self._buffers = {k: map_columnar(v, lambda a: np.empty((self.capacity,) + a.shape[1:], a.dtype)) for k, v in buffers.items()}
        self._store(kept, 0)
        self._size = len(keep)

    def close(self) -> None:
        """Flush completed episodes and drop the rows of unfinished ones."""
        self.flush()
        self._size = 0


@dataclass
class CollectStats:
    """What a collection run produced."""

    episodes: int
    steps: int
    env_steps: int
    seconds: float
    mean_return: float


def collect(
    env_id: str,
    make_policy: Callable[[gym.vector.VectorEnv], Policy],
    sink: RowSink,
    *,
    episodes: int | None = None,
    steps: int | None = None,
    num_envs: int = 8,
    seed: int = 0,
    show_progress: bool = True,
) -> CollectStats:
    """Run a policy in `num_envs` vector envs until `episodes` whole episodes (or at least
    `steps` transitions in whole episodes) are done, sending rows to `sink`.

    `make_policy` receives the vector env (for its spaces) and returns the batched policy.
    Truncation and termination stay apart, and `next_obs` of a truncated step is the real
    final observation: the env steps through :class:`~rlpipe.envs.stepper.VecStepper`, which
    marks the reset step after an episode's end (next-step autoreset), and that row is dropped.
    """
    if (episodes is None) == (steps is None):
        raise RlpipeError("give exactly one of --episodes and --steps")
    if (episodes if episodes is not None else steps) < 1:
        raise RlpipeError("--episodes/--steps must be at least 1")
    envs = make_vec_env(env_id, num_envs)
    try:
        policy = make_policy(envs)
        assembler = EpisodeAssembler(num_envs, sink, max_episodes=episodes)
        stepper = VecStepper(envs, None, seed, assembler.add_step)
        env_steps = 0
        start = time.perf_counter()
        total = episodes if episodes is not None else steps
        done = lambda: assembler.episodes_done if episodes is not None else assembler.steps_done  # noqa: E731
        with _progress(show_progress) as progress:
            task = progress.add_task(f"collect {env_id}", total=total, rate="", ret="")
            next_update = start
            while done() < total:
                stepper.step(policy(stepper.obs))
                env_steps += num_envs
                now = time.perf_counter()
                if now >= next_update:
                    next_update = now + 0.25
                    rate = f"{env_steps / max(now - start, 1e-9):,.0f} steps/s"
                    progress.update(task, completed=min(done(), total), rate=rate, ret=_mean_return_text(assembler))
            assembler.close()
            progress.update(task, completed=total, ret=_mean_return_text(assembler))
    finally:
        envs.close()
    returns = list(assembler.recent_returns)
    return CollectStats(
        episodes=assembler.episodes_done,
        steps=assembler.steps_done,
        env_steps=env_steps,
        seconds=time.perf_counter() - start,
        mean_return=float(np.mean(returns)) if returns else float("nan"),
    )


def _mean_return_text(assembler: EpisodeAssembler) -> str:
    if not assembler.recent_returns:
        return ""
    return f"{assembler.episodes_done} episodes, return {np.mean(assembler.recent_returns):.1f}"


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[ret]}"),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
    )
