"""A tiny env with uint8 image observations (8 x 8 x 3 frames), for the image data path.

Registered as `TinyFrames-v0` on import: every frame is fresh random pixels with the step
count in its first pixel, so no two frames of an episode are equal; the episode terminates
with probability 0.15 per step (some last fewer steps than a frame stack is deep) and is
truncated after 12 steps. Reward: 1 when the action equals the parity of the step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TinyFramesEnv(gym.Env):
    observation_space = spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def _frame(self) -> np.ndarray:
        frame = self.np_random.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        frame[0, 0, 0] = self.count
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.count = 0
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self.count % 2)
        self.count += 1
        return self._frame(), reward, bool(self.np_random.random() < 0.15), False, {}


if "TinyFrames-v0" not in gym.registry:
    gym.register("TinyFrames-v0", entry_point="tests.image_env:TinyFramesEnv", max_episode_steps=12)
