"""A tiny env with nested Dict observations (a Dict inside a Dict), for dataset round trips.

Registered as `NestedDict-v0` on import: a point drifts by its action; the episode
terminates when it leaves [-3, 3] and is truncated after 20 steps. `info["is_success"]`
reports whether the point is right of the origin.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class NestedDictEnv(gym.Env):
    observation_space = spaces.Dict(
        {
            "pos": spaces.Box(-10.0, 10.0, (2,), np.float32),
            "inner": spaces.Dict({"vel": spaces.Box(-1.0, 1.0, (1,), np.float32), "count": spaces.Discrete(64)}),
        }
    )
    action_space = spaces.Discrete(2)

    def _obs(self) -> dict[str, Any]:
        return {"pos": self.pos.copy(), "inner": {"vel": self.vel.copy(), "count": np.int64(self.count)}}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self.vel = np.zeros(1, np.float32)
        self.count = 0
        return self._obs(), {"is_success": False}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict]:
        self.vel = np.array([0.5 if action else -0.5], np.float32)
        self.pos = (self.pos + self.vel[0] + self.np_random.normal(0.0, 0.3, 2)).astype(np.float32)
        self.count += 1
        terminated = bool(np.abs(self.pos).max() > 3.0)
        return self._obs(), float(-np.abs(self.pos).sum()), terminated, False, {"is_success": bool(self.pos[0] > 0)}


if "NestedDict-v0" not in gym.registry:
    gym.register("NestedDict-v0", entry_point="tests.nested_env:NestedDictEnv", max_episode_steps=20)
