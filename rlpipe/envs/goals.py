"""Goal-conditioned observations (the Gymnasium-Robotics goal API) as network inputs.

A goal env observes a Dict with ``observation``, ``achieved_goal`` and ``desired_goal``.
Policies and critics see ``concat(observation, desired_goal)``; ``achieved_goal`` only
serves hindsight relabelling. This is the one place that flattening is defined: online
HER, offline training on goal datasets, evaluation and loaded policies all call it.
Torch-free, like the rest of ``rlpipe.envs``.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from gymnasium import spaces

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
NETWORK_KEYS = ("observation", "desired_goal")  # what the networks see, in this order


def is_goal_space(space: spaces.Space) -> bool:
    """True for a Dict holding the goal keys, with flat Box ``observation`` and ``desired_goal``."""
    return (
        isinstance(space, spaces.Dict)
        and set(GOAL_KEYS) <= set(space.spaces)
        and all(isinstance(sub := space[key], spaces.Box) and len(sub.shape) == 1 for key in NETWORK_KEYS)
    )


def flat_observation_space(space: spaces.Space) -> spaces.Box:
    """The Box the networks see: ``space`` itself, or a goal Dict's observation + desired goal."""
    if not is_goal_space(space):
        return space  # type: ignore[return-value]  # any other space passes through: callers check it (require_spaces, ope)
    assert isinstance(space, spaces.Dict)  # is_goal_space checked it
    parts = [cast(spaces.Box, space[key]) for key in NETWORK_KEYS]  # is_goal_space checked they are Boxes
    low = np.concatenate([p.low for p in parts]).astype(np.float32)
    high = np.concatenate([p.high for p in parts]).astype(np.float32)
    return spaces.Box(low, high, dtype=np.float32)


def flatten_obs(obs: Any) -> np.ndarray:
    """Goal Dict observation(s) -> ``concat(observation, desired_goal)`` on the last axis;
    anything else is returned as an array unchanged (so callers need not branch)."""
    if isinstance(obs, dict):
        return np.concatenate([np.asarray(obs[key], np.float32) for key in NETWORK_KEYS], axis=-1)
    return np.asarray(obs)
