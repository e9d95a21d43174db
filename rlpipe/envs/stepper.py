"""Stepping vector envs in gymnasium's NEXT_STEP autoreset mode: the one stepper that
collection, training rollouts and evaluation share.

In that mode the step that ends an episode returns the true final observation, and the
*following* step is a reset step: its action is ignored, its reward is 0 and it returns
the first observation of the next episode. :class:`VecStepper` marks those reset steps
with ``valid = False`` so consumers drop them. A vector env in another mode would make the
final observation unreachable (same-step autoreset returns the reset observation as
``next_obs``), so it is refused. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlpipe.envs.spaces import ActionScaler
from rlpipe.envs.state import env_state, load_env_state
from rlpipe.errors import RlpipeError


@dataclass
class StepBatch:
    """One vector-env step, one row per env.

    ``actions`` are what the policy gave (e.g. in [-1, 1]), ``env_actions`` what the env
    received. ``valid`` is False on reset steps. ``episode_return`` and ``episode_length``
    are each env's running totals including this step (over valid steps only), so where
    :attr:`finished` is True they are the finished episode's return and length.
    """

    obs: Any
    actions: np.ndarray
    env_actions: np.ndarray
    rewards: np.ndarray
    next_obs: Any
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray
    infos: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> np.ndarray:
        """The env reported the end of an episode (on a reset step this is False)."""
        return self.terminated | self.truncated

    @property
    def finished(self) -> np.ndarray:
        """An episode really ended at this step (done on a valid step)."""
        return self.done & self.valid


StepSink = Callable[[StepBatch], None]
"""Receives every step (reset steps included, marked by ``valid``), e.g. to store a run's transitions."""


class EpisodeReturns:
    """A :data:`StepSink` that records the return of every finished episode (``returns``, in
    order of completion), e.g. to show a training run's sample efficiency."""

    def __init__(self) -> None:
        self.returns: list[float] = []

    def __call__(self, step: StepBatch) -> None:
        self.returns.extend(step.episode_return[step.finished].tolist())


def require_next_step_autoreset(envs: gym.vector.VectorEnv) -> None:
    """Raise a one-line RlpipeError unless ``envs`` resets in NEXT_STEP mode."""
    mode = envs.metadata.get("autoreset_mode")
    if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.NEXT_STEP.value):
        raise RlpipeError(
            f"vector env {envs} uses autoreset mode {mode!r}; rlpipe needs {AutoresetMode.NEXT_STEP} "
            "(the step after an episode's end is the reset step), so final observations are kept"
        )


class VecStepper:
    """Holds a vector env's current observation and the per-env ``valid`` mask.

    Also counts real (valid) transitions and finished episodes, and keeps the latest
    finished episode's return. ``scaler`` maps policy actions to env actions (None: the
    policy already gives env actions). ``step_sink`` sees every :class:`StepBatch`.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        scaler: ActionScaler | None,
        seed: int,
        step_sink: StepSink | None = None,
    ) -> None:
        require_next_step_autoreset(envs)
        self.envs, self.scaler, self.step_sink = envs, scaler, step_sink
        self.obs, self.infos = envs.reset(seed=seed)  # infos: what came with ``obs``
        self.num_envs = envs.num_envs
        self.valid = np.ones(self.num_envs, bool)
        self.env_steps = 0
        self.episodes = 0
        self.last_return: float | None = None
        self._ep_return = np.zeros(self.num_envs)
        self._ep_length = np.zeros(self.num_envs, np.int64)

    def step(self, actions: np.ndarray) -> StepBatch:
        """Send ``actions`` to the envs and return the resulting transitions."""
        env_actions = actions if self.scaler is None else self.scaler.to_env(actions)
        next_obs, rewards, term, trunc, infos = self.envs.step(env_actions)
        ep_return = self._ep_return + rewards * self.valid
        ep_length = self._ep_length + self.valid
        batch = StepBatch(self.obs, actions, env_actions, rewards, next_obs, term, trunc, self.valid, ep_return, ep_length, infos)
        if self.step_sink is not None:
            self.step_sink(batch)
        self.env_steps += int(self.valid.sum())
        finished = batch.finished
        if finished.any():
            self.episodes += int(finished.sum())
            self.last_return = float(ep_return[finished][-1])
        self._ep_return = np.where(finished, 0.0, ep_return)
        self._ep_length = np.where(finished, 0, ep_length)
        self.valid = ~batch.done
        self.obs, self.infos = next_obs, infos
        return batch

    _RESUMED = ("obs", "infos", "valid", "env_steps", "episodes", "last_return", "_ep_return", "_ep_length")

    def state_dict(self) -> dict[str, Any]:
        """Everything the next steps depend on, for a resumable checkpoint, as plain data: the
        counters, the current observations and masks, and the vector env's state
        (:func:`rlpipe.envs.state.env_state`: sub-envs' physical state, step counters and
        generators; an env that cannot be recorded that way is an RlpipeError)."""
        return {"envs": env_state(self.envs), **{name: getattr(self, name) for name in self._RESUMED}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the saved env state goes into the live env's
        objects (:func:`rlpipe.envs.state.load_env_state`), so whoever holds ``envs`` (the
        training loop that closes it) steps the restored env."""
        load_env_state(self.envs, state["envs"])
        for name in self._RESUMED:
            if not (type(state[name]) is dict if name == "infos" else _same_layout(getattr(self, name), state[name])):
                raise RlpipeError(f"the saved stepper's {name} does not fit this env")
            setattr(self, name, state[name])


def _same_layout(live: Any, saved: Any) -> bool:
    """Whether ``saved`` can stand for the stepper's ``live`` value: arrays of the same dtype
    and shape, dicts of the same keys, ints for ints, a float or None for a latest return."""
    if isinstance(live, np.ndarray):
        return isinstance(saved, np.ndarray) and (saved.dtype, saved.shape) == (live.dtype, live.shape)
    if isinstance(live, dict):
        return type(saved) is dict and saved.keys() == live.keys() and all(_same_layout(live[k], saved[k]) for k in live)
    if type(live) is int:
        return type(saved) is int
    return (live is None or type(live) is float) and (saved is None or type(saved) is float)
