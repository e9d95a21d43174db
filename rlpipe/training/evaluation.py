"""Vectorised, deterministic policy evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch import nn

from rlpipe.envs import make_vec_env
from rlpipe.envs.goals import flatten_obs, is_goal_space
from rlpipe.envs.spaces import ActionScaler
from rlpipe.envs.stepper import VecStepper
from rlpipe.limits import MAX_EPISODES, check_count
from rlpipe.nets.recurrent import RecurrentPolicy

PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A batch of observations -> a batch of env actions (already scaled to the env's bounds)."""


@runtime_checkable
class EpisodicPolicy(Protocol):
    """A policy function that keeps state per env (a planner's warm start): :func:`evaluate`
    calls ``start_episodes(rows)`` with the mask of envs whose next observation starts an
    episode, so no state carries over from one episode into the next."""

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...

    def start_episodes(self, rows: np.ndarray) -> None: ...


@runtime_checkable
class RewardConditionedPolicy(Protocol):
    """A policy function that conditions on the rewards it earned (a Decision Transformer's
    return-to-go): :func:`evaluate` calls ``record_rewards(rewards)`` after each step with
    every env's reward ``[n]`` (0 on an autoreset step), before reporting episode starts."""

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...

    def record_rewards(self, rewards: np.ndarray) -> None: ...


class Acting(Protocol):
    """An actor network's acting interface (`rlpipe.nets.networks`): a batch of observations
    -> a batch of actions in the policy's range."""

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor: ...


@dataclass(frozen=True)
class EvalResult:
    mean: float
    std: float
    returns: list[float]
    lengths: list[int]
    success_rate: float | None = None  # goal envs only: share of episodes that reached the goal

    @property
    def length_mean(self) -> float:
        """The episodes' mean length in env steps."""
        return float(np.mean(self.lengths))


def policy_frame_stack(actor: nn.Module) -> int:
    """How many frames ``actor`` reads per decision: its encoder spec's ``frame_stack``
    (`rlpipe.training.env.encoder_spec`), 1 without one."""
    spec = getattr(actor, "spec", None)
    encoder = spec.get("encoder") if isinstance(spec, dict) else None
    return int(encoder.get("frame_stack", 1)) if isinstance(encoder, dict) else 1


class EpisodeStarts:
    """Which envs start an episode at their next observation: ``start(rows)`` marks them (marks
    add up until the next step uses them). The per-env state of :class:`FrameStacks` and
    :class:`HiddenStates` starts afresh at the marked envs."""

    def __init__(self) -> None:
        self._fresh: np.ndarray | None = None

    def start(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, bool)
        self._fresh = rows.copy() if self._fresh is None or len(self._fresh) != len(rows) else self._fresh | rows

    def _starting(self, envs: int) -> np.ndarray | None:
        """The envs marked since the last step (None: none, or marks for another number of envs); clears the marks."""
        fresh, self._fresh = self._fresh, None
        return fresh if fresh is not None and len(fresh) == envs and fresh.any() else None


class FrameStacks(EpisodeStarts):
    """Each env's last k observations, as gymnasium's ``FrameStackObservation(env, k,
    padding_type="reset")`` stacks them: an episode's first observation fills its env's stack.
    ``start(rows)`` marks the envs whose next observation starts an episode; every env starts
    one at the first push, and again when the number of envs changes."""

    def __init__(self, frame_stack: int) -> None:
        super().__init__()
        self.frame_stack = frame_stack
        self._stacks: np.ndarray | None = None

    def push(self, obs: np.ndarray) -> np.ndarray:
        """The stacks ``[B, k, *frame]`` after this step's observations ``[B, *frame]``."""
        starting = self._starting(len(obs))
        if self._stacks is None or self._stacks.shape[0] != len(obs) or self._stacks.shape[2:] != obs.shape[1:]:
            self._stacks = np.empty((len(obs), self.frame_stack) + obs.shape[1:], obs.dtype)
            starting = np.ones(len(obs), bool)
        self._stacks[:, :-1] = self._stacks[:, 1:]
        self._stacks[:, -1] = obs
        if starting is not None:
            self._stacks[starting] = obs[starting][:, None]
        return self._stacks.copy()

    def state_dict(self) -> dict[str, np.ndarray | None]:
        """The stacks and the envs marked to start an episode (a resumed run's training loop
        stacks on from them)."""
        return {"stacks": self._stacks, "fresh": self._fresh}

    def load_state_dict(self, state: dict[str, np.ndarray | None]) -> None:
        self._stacks, self._fresh = state["stacks"], state["fresh"]


class HiddenStates(EpisodeStarts):
    """Each env's hidden state of a recurrent policy (:class:`RecurrentPolicy`): zero at an
    episode's start (``start(rows)``, as :class:`FrameStacks`), and for every env at the
    first step and when the number of envs changes."""

    def __init__(self, actor: RecurrentPolicy) -> None:
        super().__init__()
        self.actor = actor
        self._state: torch.Tensor | None = None

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The actions for this step's observations ``[B, obs_dim]``, the states moved on."""
        starting = self._starting(len(obs))
        if self._state is None or self._state.shape[0] != len(obs):
            self._state = self.actor.initial_state(len(obs))
        elif starting is not None:
            self._state[torch.as_tensor(starting, device=self._state.device)] = 0.0
        action, self._state = self.actor.step(obs, self._state, deterministic)
        return action


class ActorPolicy:
    """An actor (``act(obs, deterministic)``) as a numpy batch -> env-action function
    (:data:`PolicyFn`, and an :class:`EpisodicPolicy`).

    Goal envs' Dict observations are flattened as the networks were trained on them. An
    actor that reads k stacked frames (`policy_frame_stack`) is given one observation per env
    and stacks the last k itself (:class:`FrameStacks`; the loop that steps the envs reports
    episode starts through ``start_episodes``), so envs, and the datasets collected in them,
    keep one frame per step; observations that are already stacks ``[B, k, *frame]`` (a
    sampler's, a dataset's rows stacked) go to the actor as they are. A recurrent actor
    keeps a hidden state per env the same way (:class:`HiddenStates`).
    """

    def __init__(self, actor: nn.Module, scaler: ActionScaler, device: torch.device | str = "cpu", deterministic: bool = True) -> None:
        self.actor, self.scaler, self.device, self.deterministic = actor, scaler, torch.device(device), deterministic
        self.frame_stack = policy_frame_stack(actor)
        encoder = cast("dict[str, Any]", actor.spec).get("encoder") if self.frame_stack > 1 else None  # a dict: policy_frame_stack read it
        self._frame_rank = len(encoder["shape"]) if encoder else 0
        self._frames = FrameStacks(self.frame_stack) if self.frame_stack > 1 else None
        self._hidden = HiddenStates(actor) if isinstance(actor, RecurrentPolicy) else None

    def start_episodes(self, rows: np.ndarray) -> None:
        if self._frames is not None:
            self._frames.start(rows)
        if self._hidden is not None:
            self._hidden.start(rows)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        array = flatten_obs(obs)
        if self._frames is not None and array.ndim == self._frame_rank + 1:  # one frame per env
            array = self._frames.push(array)
        array = array.astype(np.float32, copy=False)
        if not array.flags.writeable:  # a memory-mapped dataset column (FQE acts on one): torch warns on read-only arrays
            array = array.copy()  # one batch of observations, cheap beside the forward pass
        with torch.no_grad():
            obs_t = torch.as_tensor(array, device=self.device)
            actor = cast(Acting, self.actor)
            action = actor.act(obs_t, self.deterministic) if self._hidden is None else self._hidden.act(obs_t, self.deterministic)
            return self.scaler.to_env(action.cpu().numpy())


def policy_fn(actor: nn.Module, scaler: ActionScaler, device: torch.device | str = "cpu", deterministic: bool = True) -> ActorPolicy:
    """``actor`` as a numpy batch -> env-action function: see :class:`ActorPolicy`."""
    return ActorPolicy(actor, scaler, device, deterministic)


def evaluate(policy: PolicyFn, env_id: str, episodes: int = 10, seed: int = 0, max_envs: int = 32) -> EvalResult:
    """Run ``episodes`` full episodes with ``policy`` on vectorised envs; returns statistics.

    Sub-env ``i`` is seeded with ``seed + i`` and runs a fixed quota of episodes, so the
    result depends only on (policy, env_id, episodes, seed). A policy with state per env
    hears of episode starts (:class:`EpisodicPolicy`) and of rewards
    (:class:`RewardConditionedPolicy`). In goal envs an episode is a success when its last
    step reports ``info["is_success"]`` (or, without it, terminates).
    """
    check_count(episodes, "episodes", MAX_EPISODES)
    n = max(1, min(episodes, max_envs))
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    envs = make_vec_env(env_id, n)
    goal_env = is_goal_space(envs.single_observation_space)
    returns: list[list[float]] = [[] for _ in range(n)]
    lengths: list[list[int]] = [[] for _ in range(n)]
    successes: list[list[bool]] = [[] for _ in range(n)]
    try:
        stepper = VecStepper(envs, None, seed)
        start_episodes = policy.start_episodes if isinstance(policy, EpisodicPolicy) else None
        record_rewards = policy.record_rewards if isinstance(policy, RewardConditionedPolicy) else None
        if start_episodes is not None:
            start_episodes(np.ones(n, bool))
        while any(len(r) < q for r, q in zip(returns, quota)):
            step = stepper.step(policy(stepper.obs))
            if record_rewards is not None:
                record_rewards(step.rewards)
            if start_episodes is not None:
                start_episodes(~step.valid)  # those envs just reset (NEXT_STEP autoreset)
            infos = step.infos
            success = np.where(infos.get("_is_success", False), infos.get("is_success", False), step.terminated)
            for i in np.flatnonzero(step.finished):
                if len(returns[i]) < quota[i]:
                    returns[i].append(float(step.episode_return[i]))
                    lengths[i].append(int(step.episode_length[i]))
                    successes[i].append(bool(success[i]))
    finally:
        envs.close()
    flat = [r for rs in returns for r in rs]
    success_rate = float(np.mean([s for ss in successes for s in ss])) if goal_env else None
    return EvalResult(float(np.mean(flat)), float(np.std(flat)), flat, [n for ns in lengths for n in ns], success_rate)
