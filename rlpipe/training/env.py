"""Environment construction, action-space checks, action rescaling and device choice.

This is the ONE place where policy actions meet the env: continuous policies emit actions
in [-1, 1] and :class:`ActionScaler` maps them to the env's ``[low, high]``; discrete
policies emit indices that are offset by the space's ``start``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.envs import env_spaces, make_vec_env  # noqa: F401  (re-exported: env construction lives with the envs)
from rlpipe.envs.goals import is_goal_space
from rlpipe.errors import RlpipeError

BOX, DISCRETE = "box", "discrete"
GOAL = "goal"  # observation kind: a goal-conditioned Dict (flattened for the networks)
_KIND_WORDS = {BOX: "a continuous (Box)", DISCRETE: "a discrete (Discrete)"}
_OBS_WORDS = {BOX: "a flat Box", GOAL: "a goal-conditioned Dict (observation, achieved_goal, desired_goal)"}


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cuda`` without a GPU is an RlpipeError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RlpipeError(f"--device {device} requested but no CUDA device is available; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise RlpipeError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def space_kind(space: spaces.Space) -> str:
    if isinstance(space, spaces.Box):
        return BOX
    if isinstance(space, spaces.Discrete):
        return DISCRETE
    return type(space).__name__


def require_spaces(
    algo: str,
    env_id: str,
    obs_space: spaces.Space,
    act_space: spaces.Space,
    kinds: tuple[str, ...],
    observations: tuple[str, ...] = (BOX,),
) -> None:
    """Raise a one-line RlpipeError when ``algo`` cannot handle the env's spaces.

    ``kinds`` are the accepted action spaces (BOX, DISCRETE), ``observations`` the accepted
    observation spaces: BOX (flat) and/or GOAL (a goal Dict, see rlpipe.envs.goals).
    """
    if space_kind(act_space) not in kinds:
        wanted = " or ".join(_KIND_WORDS[k] for k in kinds)
        raise RlpipeError(f"{algo} needs {wanted} action space; {env_id} has {act_space}")
    flat = isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1
    if not ((BOX in observations and flat) or (GOAL in observations and is_goal_space(obs_space))):
        wanted = " or ".join(_OBS_WORDS[k] for k in observations)
        raise RlpipeError(f"{algo} needs {wanted} observation space; {env_id} has {obs_space}")
    if isinstance(act_space, spaces.Box) and len(act_space.shape) != 1:
        raise RlpipeError(f"{algo} needs a 1-D Box action space; {env_id} has {act_space}")


def action_dim(space: spaces.Space) -> int:
    """Policy output size: number of actions (Discrete) or action dimensions (Box)."""
    return int(space.n) if isinstance(space, spaces.Discrete) else int(space.shape[0])


class ActionScaler:
    """Maps policy actions to env actions for one action space.

    Box: clip to [-1, 1], then affine map to ``[low, high]`` (unbounded dims pass through).
    Discrete: integer index plus ``start``.
    """

    def __init__(self, space: spaces.Space) -> None:
        self.discrete = isinstance(space, spaces.Discrete)
        if self.discrete:
            self.start = int(space.start)
            return
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        self.bounded = np.isfinite(low) & np.isfinite(high)
        self.low = np.where(self.bounded, low, -1.0)
        self.high = np.where(self.bounded, high, 1.0)
        self.dtype = space.dtype

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """Policy action(s) -> env action(s); works on single actions and batches."""
        if self.discrete:
            return np.asarray(action, np.int64) + self.start
        a = np.asarray(action, np.float64)
        scaled = self.low + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)
        return np.where(self.bounded, scaled, a).astype(self.dtype)

    def from_env(self, action: np.ndarray) -> np.ndarray:
        """Env action(s) -> policy space (e.g. dataset actions for offline training)."""
        if self.discrete:
            return np.asarray(action, np.int64) - self.start
        a = np.asarray(action, np.float64)
        unit = 2.0 * (a - self.low) / (self.high - self.low) - 1.0
        return np.where(self.bounded, unit, a).astype(np.float32)


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """Minimal JSON description of an action space (enough to rebuild the scaler)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "dtype": str(space.dtype)}
    raise TypeError(f"cannot serialise {space}")


def space_from_json(data: dict[str, Any]) -> spaces.Space:
    """The action space ``space_to_json`` described; a malformed description is an RlpipeError."""
    try:
        if data["type"] == "Discrete":
            return spaces.Discrete(data["n"], start=data.get("start", 0))
        dtype = np.dtype(data.get("dtype", "float32"))
        return spaces.Box(np.array(data["low"], dtype), np.array(data["high"], dtype), dtype=dtype)
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise RlpipeError(f"malformed action space description {data!r}: {exc}") from None


def require_policy_fits_env(meta: dict[str, Any], run_dir: Any) -> None:
    """Raise unless a checkpoint's policy takes the observations and gives the actions of
    the env it names (a checkpoint.json edited to another env fails here, not mid-evaluation)."""
    obs_space, act_space = env_spaces(meta["env_id"])
    if is_goal_space(obs_space):
        from rlpipe.envs.goals import flat_observation_space

        obs_space = flat_observation_space(obs_space)
    saved = space_from_json(meta["action_space"])
    obs_dim = meta["policy"]["spec"].get("obs_dim")
    same_actions = type(saved) is type(act_space) and (
        saved.n == act_space.n if isinstance(saved, spaces.Discrete) else saved.shape == act_space.shape
    )
    if obs_dim != int(np.prod(obs_space.shape)) or not same_actions:
        raise RlpipeError(
            f"checkpoint in {run_dir} does not fit {meta['env_id']}: the policy takes {obs_dim} observation values and "
            f"acts in {saved}, the env has observations {obs_space.shape} and actions {act_space}"
        )
