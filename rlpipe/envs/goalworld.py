"""GoalWorld: the reference text's 2-D goal-reaching task, with the Gymnasium-Robotics goal API.

The agent starts at (0, 0) on the plane [0, 5]^2 and moves by an action in [-1, 1]^2 per
step (the position is clipped to the plane). A goal is drawn uniformly from [3.5, 4.5]^2.
Reward is -1 per step and 0 once within 0.15 of the goal, which ends the episode
(terminated); the registered env truncates at 50 steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

DISTANCE_THRESHOLD = 0.15
GOAL_LOW, GOAL_HIGH = 3.5, 4.5
PLANE_LOW, PLANE_HIGH = 0.0, 5.0


class GoalWorldEnv(gym.Env):
    """Dict observation (`observation`, `achieved_goal`, `desired_goal`), Box(-1, 1, (2,)) actions."""

    metadata = {"render_modes": []}

    def __init__(self, distance_threshold: float = DISTANCE_THRESHOLD) -> None:
        self.distance_threshold = distance_threshold
        plane = gym.spaces.Box(PLANE_LOW, PLANE_HIGH, (2,), np.float32)
        # Relabelled goals can be any reachable position, so desired_goal spans the plane.
        self.observation_space = gym.spaces.Dict({"observation": plane, "achieved_goal": plane, "desired_goal": plane})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._position = np.zeros(2, np.float32)
        self._goal = np.zeros(2, np.float32)

    def _observation(self) -> dict[str, np.ndarray]:
        return {"observation": self._position.copy(), "achieved_goal": self._position.copy(), "desired_goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self._position = np.zeros(2, np.float32)
        self._goal = self.np_random.uniform(GOAL_LOW, GOAL_HIGH, size=2).astype(np.float32)
        return self._observation(), {"is_success": False}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        move = np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        self._position = np.clip(self._position + move, PLANE_LOW, PLANE_HIGH).astype(np.float32)
        obs = self._observation()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], None))
        success = reward == 0.0
        return obs, reward, success, False, {"is_success": success}

    def goal_distance(self, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        return np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """-1 where the goal is not reached, 0 where it is; works on batches (leading axes)."""
        return -(self.goal_distance(achieved_goal, desired_goal) > self.distance_threshold).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Reaching the goal ends the episode; works on batches."""
        return self.goal_distance(achieved_goal, desired_goal) <= self.distance_threshold

    def compute_truncated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Truncation comes from the time limit only."""
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)
