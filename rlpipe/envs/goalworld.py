"""GoalWorld: the reference text's 2-D goal-reaching task, with the Gymnasium-Robotics goal API.

The agent starts at (0, 0) on the plane [0, 5]^2 and moves by an action in [-1, 1]^2 per
step (the position is clipped to the plane). A goal is drawn uniformly from [3.5, 4.5]^2.
Reward is -1 per step and 0 once within 0.15 of the goal, which ends the episode
(terminated); the registered env truncates at 50 steps. ``render_mode="rgb_array"`` draws
the plane, the goal region, the goal's reach disc, the path so far and the agent.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

DISTANCE_THRESHOLD = 0.15
GOAL_LOW, GOAL_HIGH = 3.5, 4.5
PLANE_LOW, PLANE_HIGH = 0.0, 5.0
RENDER_SIZE = 256  # pixels per side of rendered frames
AGENT_RADIUS = 0.12  # plane units, for drawing only
COLOURS = {  # RGB
    "plane": (246, 246, 240),
    "grid": (220, 220, 214),
    "goal_region": (206, 234, 206),
    "goal": (52, 160, 72),
    "path": (150, 170, 220),
    "agent": (40, 80, 210),
}


def goal_distance(achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """Euclidean distance over the last axis (batches welcome)."""
    return np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)


def _spaces() -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    plane = gym.spaces.Box(PLANE_LOW, PLANE_HIGH, (2,), np.float32)
    # Relabelled goals can be any reachable position, so desired_goal spans the plane.
    observation = gym.spaces.Dict({"observation": plane, "achieved_goal": plane, "desired_goal": plane})
    return observation, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def render_frame(
    position: np.ndarray, goal: np.ndarray, path: np.ndarray, distance_threshold: float, size: int = RENDER_SIZE
) -> np.ndarray:
    """An RGB frame [size, size, 3] (uint8) of the plane, y pointing up: unit grid, the goal
    region [3.5, 4.5]^2, the disc within ``distance_threshold`` of ``goal``, the visited
    ``path`` [T, 2] and the agent at ``position``. Pure numpy: every shape is a pixel mask."""
    scale = (PLANE_HIGH - PLANE_LOW) / size
    centres = PLANE_LOW + (np.arange(size) + 0.5) * scale
    x, y = np.meshgrid(centres, centres[::-1])  # row 0 is the top of the plane
    frame = np.empty((size, size, 3), np.uint8)
    frame[:] = COLOURS["plane"]
    frame[(np.abs(x - np.round(x)) < scale) | (np.abs(y - np.round(y)) < scale)] = COLOURS["grid"]
    frame[(x >= GOAL_LOW) & (x <= GOAL_HIGH) & (y >= GOAL_LOW) & (y <= GOAL_HIGH)] = COLOURS["goal_region"]

    def disc(centre: np.ndarray, radius: float) -> np.ndarray:
        return (x - centre[0]) ** 2 + (y - centre[1]) ** 2 <= max(radius, 1.5 * scale) ** 2

    frame[disc(goal, distance_threshold)] = COLOURS["goal"]
    for point in path:
        frame[disc(point, 0.45 * AGENT_RADIUS)] = COLOURS["path"]
    frame[disc(position, AGENT_RADIUS)] = COLOURS["agent"]
    return frame


class _GoalAPI:
    """compute_reward / compute_terminated / compute_truncated, vectorised over leading axes."""

    distance_threshold: float

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """-1 where the goal is not reached, 0 where it is."""
        return -(goal_distance(achieved_goal, desired_goal) > self.distance_threshold).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Reaching the goal ends the episode."""
        return goal_distance(achieved_goal, desired_goal) <= self.distance_threshold

    def compute_truncated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """Truncation comes from the time limit only."""
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)


class GoalWorldEnv(_GoalAPI, gym.Env):
    """Dict observation (`observation`, `achieved_goal`, `desired_goal`), Box(-1, 1, (2,)) actions."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, distance_threshold: float = DISTANCE_THRESHOLD, render_mode: str | None = None) -> None:
        self.distance_threshold = distance_threshold
        self.render_mode = render_mode
        self.observation_space, self.action_space = _spaces()
        self._position = np.zeros(2, np.float32)
        self._goal = np.zeros(2, np.float32)
        self._path: list[np.ndarray] = []  # positions this episode, for rendering

    def _observation(self) -> dict[str, np.ndarray]:
        return {"observation": self._position.copy(), "achieved_goal": self._position.copy(), "desired_goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self._position = np.zeros(2, np.float32)
        self._goal = self.np_random.uniform(GOAL_LOW, GOAL_HIGH, size=2).astype(np.float32)
        self._path = [self._position.copy()]
        return self._observation(), {"is_success": False}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        move = np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        self._position = np.clip(self._position + move, PLANE_LOW, PLANE_HIGH).astype(np.float32)
        self._path.append(self._position.copy())
        obs = self._observation()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], None))
        success = reward == 0.0
        return obs, reward, success, False, {"is_success": success}

    def render(self) -> np.ndarray | None:
        """The current frame in ``rgb_array`` mode (None in any other mode)."""
        if self.render_mode != "rgb_array":
            return None
        return render_frame(self._position, self._goal, np.asarray(self._path), self.distance_threshold)


class GoalWorldVectorEnv(_GoalAPI, VectorEnv):
    """`num_envs` GoalWorlds stepped as numpy arrays (next-step autoreset, like CartPoleVectorEnv).

    After an episode ends, the next `step` resets those envs (their action is ignored,
    reward 0) and returns the first observation of the new episode. `reset(seed=s)` seeds
    one generator for all envs, so a run is exactly reproducible for a given num_envs.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 50, distance_threshold: float = DISTANCE_THRESHOLD) -> None:
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps
        self.distance_threshold = distance_threshold
        self.single_observation_space, self.single_action_space = _spaces()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._position = np.zeros((num_envs, 2), np.float32)
        self._goal = np.zeros((num_envs, 2), np.float32)
        self._steps = np.zeros(num_envs, np.int32)
        self._prev_done = np.zeros(num_envs, bool)

    def _observation(self) -> dict[str, np.ndarray]:
        return {"observation": self._position.copy(), "achieved_goal": self._position.copy(), "desired_goal": self._goal.copy()}

    def _new_goals(self, count: int) -> np.ndarray:
        return self.np_random.uniform(GOAL_LOW, GOAL_HIGH, size=(count, 2)).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self._position[:] = 0.0
        self._goal = self._new_goals(self.num_envs)
        self._steps[:] = 0
        self._prev_done[:] = False
        return self._observation(), {}

    def step(self, actions: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict]:
        move = np.clip(np.asarray(actions, np.float32).reshape(self.num_envs, 2), -1.0, 1.0)
        self._position = np.clip(self._position + move, PLANE_LOW, PLANE_HIGH).astype(np.float32)
        self._steps += 1
        reset = self._prev_done
        if reset.any():
            self._position[reset] = 0.0
            self._goal[reset] = self._new_goals(int(reset.sum()))
            self._steps[reset] = 0
        success = self.compute_terminated(self._position, self._goal, None) & ~reset
        reward = np.where(reset, 0.0, self.compute_reward(self._position, self._goal, None)).astype(np.float32)
        truncated = (self._steps >= self.max_episode_steps) & ~success & ~reset
        self._prev_done = success | truncated
        return self._observation(), reward, success, truncated, {"is_success": success, "_is_success": ~reset}
