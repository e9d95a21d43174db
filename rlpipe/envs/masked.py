"""Partially observed classic-control envs: gymnasium's CartPole and Pendulum with their
velocity terms hidden, so a policy must infer them from a sequence (frame stacks, recurrent
nets). Registered on import as `rlpipe/CartPoleNoVel-v1` (observation [x, theta]) and
`rlpipe/PendulumNoVel-v1` ([cos theta, sin theta]), with the full envs' time limits and dynamics:
on the same seed their observations are the full envs' with the velocities left out."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv


class KeptObservation(gym.ObservationWrapper):
    """Observe only the entries `kept` of a flat Box observation."""

    def __init__(self, env: gym.Env, kept: Sequence[int]) -> None:
        super().__init__(env)
        self.kept = np.asarray(kept)
        box = env.observation_space
        assert isinstance(box, spaces.Box)
        self.observation_space = spaces.Box(box.low[self.kept], box.high[self.kept], dtype=box.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.kept]


def cartpole_no_velocity(render_mode: str | None = None) -> gym.Env:
    """CartPole observing the cart position and the pole angle (not their velocities)."""
    return KeptObservation(CartPoleEnv(render_mode=render_mode), kept=(0, 2))


def pendulum_no_velocity(render_mode: str | None = None) -> gym.Env:
    """Pendulum observing cos and sin of its angle (not the angular velocity)."""
    return KeptObservation(PendulumEnv(render_mode=render_mode), kept=(0, 1))


def _register() -> None:
    for env_id, entry_point, full_id in (
        ("rlpipe/CartPoleNoVel-v1", "cartpole_no_velocity", "CartPole-v1"),
        ("rlpipe/PendulumNoVel-v1", "pendulum_no_velocity", "Pendulum-v1"),
    ):
        full = gym.spec(full_id)
        if env_id not in gym.registry:
            gym.register(
                env_id,
                entry_point=f"rlpipe.envs.masked:{entry_point}",
                max_episode_steps=full.max_episode_steps,
                reward_threshold=full.reward_threshold,
            )


_register()
