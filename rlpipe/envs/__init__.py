"""Environments: the ones the reference texts need that Gymnasium lacks (registered on
import), env construction with one-line errors, spaces (`spaces.py`) and the one
vector-env stepper (`stepper.py`). Torch-free, so collection and the dataset commands
start fast."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium import spaces

from rlpipe.errors import RlpipeError

if "GoalWorld-v0" not in gym.registry:
    gym.register(
        "GoalWorld-v0",
        entry_point="rlpipe.envs.goalworld:GoalWorldEnv",
        vector_entry_point="rlpipe.envs.goalworld:GoalWorldVectorEnv",
        max_episode_steps=50,
    )


def env_slug(env_id: str) -> str:
    """`CartPole-v1` -> `cartpole`: the short env name used in run and dataset names."""
    return env_id.split("/")[-1].split("-v")[0].lower()


def make_vec_env(env_id: str, num_envs: int = 1, **kwargs: Any) -> gym.vector.VectorEnv:
    """``gymnasium.make_vec`` with unknown ids turned into one clear RlpipeError.

    Uses the env's native vectorised implementation when it has one (e.g. CartPole),
    otherwise a SyncVectorEnv; both use the NEXT_STEP autoreset mode.
    """
    if num_envs < 1:
        raise RlpipeError(f"--num-envs must be >= 1, got {num_envs}")
    try:
        return gym.make_vec(env_id, num_envs=num_envs, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise RlpipeError(f"environment {env_id!r} needs an extra dependency: {exc}") from None
    except gym.error.Error:
        raise RlpipeError(f"unknown environment {env_id!r} (not registered with gymnasium)") from None


def env_spaces(env_id: str) -> tuple[spaces.Space, spaces.Space]:
    """(observation_space, action_space) of one ``env_id`` instance."""
    envs = make_vec_env(env_id, 1)
    try:
        return envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()
