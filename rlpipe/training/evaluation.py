"""Vectorised, deterministic policy evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from rlpipe.envs import make_vec_env
from rlpipe.envs.goals import flatten_obs, is_goal_space
from rlpipe.envs.spaces import ActionScaler
from rlpipe.envs.stepper import VecStepper

PolicyFn = Callable[[np.ndarray], np.ndarray]
"""A batch of observations -> a batch of env actions (already scaled to the env's bounds)."""


@runtime_checkable
class EpisodicPolicy(Protocol):
    """A policy function that keeps state per env (a planner's warm start): :func:`evaluate`
    calls ``start_episodes(rows)`` with the mask of envs whose next observation starts an
    episode, so no state carries over from one episode into the next."""

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...

    def start_episodes(self, rows: np.ndarray) -> None: ...


@dataclass(frozen=True)
class EvalResult:
    mean: float
    std: float
    returns: list[float]
    lengths: list[int]
    success_rate: float | None = None  # goal envs only: share of episodes that reached the goal


def policy_fn(actor: nn.Module, scaler: ActionScaler, device: torch.device | str = "cpu", deterministic: bool = True) -> PolicyFn:
    """Wrap an actor (``act(obs, deterministic)``) as a numpy batch -> env-action function.

    Goal envs' Dict observations are flattened as the networks were trained on them.
    """
    device = torch.device(device)

    def act(obs: np.ndarray) -> np.ndarray:
        array = flatten_obs(obs).astype(np.float32, copy=False)
        if not array.flags.writeable:  # a memory-mapped dataset column (FQE acts on one): torch warns on read-only arrays
            array = array.copy()  # one batch of observations, cheap beside the forward pass
        with torch.no_grad():
            obs_t = torch.as_tensor(array, device=device)
            return scaler.to_env(actor.act(obs_t, deterministic).cpu().numpy())

    return act


def evaluate(policy: PolicyFn, env_id: str, episodes: int = 10, seed: int = 0, max_envs: int = 32) -> EvalResult:
    """Run ``episodes`` full episodes with ``policy`` on vectorised envs; returns statistics.

    Sub-env ``i`` is seeded with ``seed + i`` and runs a fixed quota of episodes, so the
    result depends only on (policy, env_id, episodes, seed). In goal envs an episode is a
    success when its last step reports ``info["is_success"]`` (or, without it, terminates).
    """
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
        if start_episodes is not None:
            start_episodes(np.ones(n, bool))
        while any(len(r) < q for r, q in zip(returns, quota)):
            step = stepper.step(policy(stepper.obs))
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
