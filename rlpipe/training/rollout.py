"""Stepping vector envs in gymnasium's NEXT_STEP autoreset mode, shared by every algorithm.

In that mode the step that ends an episode returns the true final observation, and the
*following* step is a reset step: its action is ignored, its reward is 0 and it returns
the first observation of the next episode. :class:`VecStepper` marks those reset steps
with ``valid = False`` so algorithms (and ``step_sink`` consumers) can drop them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlpipe.training.env import ActionScaler

StepSink = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
"""``step_sink(obs, env_actions, rewards, next_obs, terminated, truncated, valid)``, batch = num_envs."""


@dataclass
class StepBatch:
    """One vector-env step; ``actions`` are in policy space, ``env_actions`` in env space."""

    obs: np.ndarray
    actions: np.ndarray
    env_actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


class VecStepper:
    """Holds a vector env's current observation and the per-env "valid" mask.

    Also counts real (valid) transitions and records finished training-episode returns.
    """

    def __init__(self, envs: gym.vector.VectorEnv, scaler: ActionScaler, seed: int, step_sink: StepSink | None = None) -> None:
        self.envs, self.scaler, self.step_sink = envs, scaler, step_sink
        self.obs, _ = envs.reset(seed=seed)
        self.num_envs = envs.num_envs
        self.valid = np.ones(self.num_envs, bool)
        self.env_steps = 0
        self.episodes = 0
        self.last_return: float | None = None
        self._ep_return = np.zeros(self.num_envs)

    def step(self, actions: np.ndarray) -> StepBatch:
        """Send policy-space ``actions`` to the envs and return the resulting transitions."""
        env_actions = self.scaler.to_env(actions)
        next_obs, rewards, term, trunc, _ = self.envs.step(env_actions)
        batch = StepBatch(self.obs, actions, env_actions, rewards, next_obs, term, trunc, self.valid)
        if self.step_sink is not None:
            self.step_sink(self.obs, env_actions, rewards, next_obs, term, trunc, self.valid)
        self.env_steps += int(self.valid.sum())
        self._ep_return += rewards * self.valid
        finished = batch.done & self.valid
        if finished.any():
            self.episodes += int(finished.sum())
            self.last_return = float(self._ep_return[finished][-1])
            self._ep_return[finished] = 0.0
        self.valid = ~batch.done
        self.obs = next_obs
        return batch


class EpisodeReturns:
    """A ``step_sink`` that records the return of every finished training episode
    (``returns``, in order of completion), so a run's sample efficiency is visible."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self._running: np.ndarray | None = None

    def __call__(self, obs: np.ndarray, env_actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                 terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray) -> None:
        if self._running is None:
            self._running = np.zeros(len(rewards))
        self._running += rewards * valid
        finished = (terminated | truncated) & valid
        self.returns.extend(float(r) for r in self._running[finished])
        self._running[finished] = 0.0
