"""Spaces: what kind of space an algorithm accepts, action rescaling, and one JSON form.

This is the ONE place where policy actions meet the env: continuous policies emit actions
in [-1, 1] and :class:`ActionScaler` maps them to the env's ``[low, high]``; discrete
policies emit indices that are offset by the space's ``start``. Spaces are written as JSON
the way Minari serializes them (dataset metadata and checkpoints alike). Torch-free.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from minari.serialization import deserialize_space, serialize_space

from rlpipe.envs.goals import is_goal_space
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_SPACE_ELEMENTS

BOX, DISCRETE = "box", "discrete"
GOAL = "goal"  # observation kind: a goal-conditioned Dict (flattened for the networks)
IMAGE = "image"  # observation kind: a uint8 or bool Box of rank 3 (H x W x C or C x H x W), read by a CNN
_KIND_WORDS = {BOX: "a continuous (Box)", DISCRETE: "a discrete (Discrete)"}
_OBS_WORDS = {
    BOX: "a flat Box",
    GOAL: "a goal-conditioned Dict (observation, achieved_goal, desired_goal)",
    IMAGE: "an image (a uint8 or bool Box of H x W x C or C x H x W)",
}
IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


def is_image_space(space: spaces.Space) -> bool:
    """True for a Box of rank 3 holding uint8 or bool values: frames a CNN encoder reads."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3 and np.dtype(space.dtype) in IMAGE_DTYPES


def space_kind(space: spaces.Space) -> str:
    """BOX, DISCRETE, or the space's class name for anything else."""
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
    observation spaces: BOX (flat), GOAL (a goal Dict, see rlpipe.envs.goals) and/or IMAGE.
    """
    if space_kind(act_space) not in kinds:
        wanted = " or ".join(_KIND_WORDS[k] for k in kinds)
        raise RlpipeError(f"{algo} needs {wanted} action space; {env_id} has {act_space}")
    flat = isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1
    accepted = (
        (BOX in observations and flat)
        or (GOAL in observations and is_goal_space(obs_space))
        or (IMAGE in observations and is_image_space(obs_space))
    )
    if not accepted:
        wanted = " or ".join(_OBS_WORDS[k] for k in observations)
        raise RlpipeError(f"{algo} needs {wanted} observation space; {env_id} has {obs_space}")
    if isinstance(act_space, spaces.Box) and len(act_space.shape) != 1:
        raise RlpipeError(f"{algo} needs a 1-D Box action space; {env_id} has {act_space}")


def action_dim(space: spaces.Space) -> int:
    """Policy output size: number of actions (Discrete) or action dimensions (Box)."""
    return int(space.n) if isinstance(space, spaces.Discrete) else int(cast(spaces.Box, space).shape[0])


class ActionScaler:
    """Maps policy actions to env actions for one action space.

    Box: clip to [-1, 1], then affine map to ``[low, high]`` (unbounded dims pass through).
    Discrete: integer index plus ``start``.
    """

    def __init__(self, space: spaces.Space) -> None:
        self.discrete = isinstance(space, spaces.Discrete)
        if self.discrete:
            self.start = int(cast(spaces.Discrete, space).start)
            return
        box = cast(spaces.Box, space)  # policies act in Discrete or Box spaces (require_spaces)
        low, high = np.asarray(box.low, np.float64), np.asarray(box.high, np.float64)
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
    """Minari's serialization of ``space`` as a JSON object (dataset metadata holds the same
    object as a string, as Minari writes it)."""
    try:
        return serialize_space(space, to_string=False)
    except NotImplementedError:
        raise RlpipeError(f"cannot serialize the space {space}") from None


def space_from_json(data: Any, where: str | None = None) -> spaces.Space:
    """A space from Minari's JSON form (string or object), or one RlpipeError: ``where`` names
    the file and field it was read from (``/x/metadata.json 'info_space'``), for the message.

    The one parser of stored spaces (dataset metadata, checkpoints): anything else than a
    space description (another JSON type, garbage, a Box of more than
    ``rlpipe.limits.MAX_SPACE_ELEMENTS`` values) is refused before anything is allocated.
    Also reads the older checkpoint form, a Box without ``shape`` (and maybe ``dtype``),
    so runs saved before the formats were unified still load.
    """
    try:
        description = json.loads(data) if isinstance(data, (str, bytes)) else data  # Minari writes infinite bounds as Infinity
        if not isinstance(description, dict):
            raise TypeError(f"expected a JSON object, got {type(description).__name__}")
        if description.get("type") == "Box" and "shape" not in description and "low" in description:
            description = {**description, "dtype": description.get("dtype", "float32"), "shape": list(np.shape(description["low"]))}
        elements = _space_elements(description)
        if elements > MAX_SPACE_ELEMENTS:
            raise ValueError(f"{elements} values, more than the {MAX_SPACE_ELEMENTS} a space may hold")
        return deserialize_space(description)
    except Exception as exc:  # minari's parser raises whatever the data provokes (KeyError, AssertionError, ...)
        place = f" in {where}" if where else ""
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise RlpipeError(f"malformed space description{place} ({reason[:200]})") from None


def _space_elements(description: Any) -> int:
    """How many values a space description's arrays hold (Box, MultiBinary and MultiDiscrete,
    summed through Dict and Tuple), from its shapes alone: what deserializing would allocate."""
    if not isinstance(description, dict):
        return 0
    kind: Any
    kind, subspaces = description.get("type"), description.get("subspaces")
    if kind in ("Dict", "Tuple"):
        children = subspaces.values() if isinstance(subspaces, dict) else subspaces if isinstance(subspaces, list) else []
        return sum(_space_elements(child) for child in children)
    shape = {"Box": description.get("shape"), "MultiBinary": description.get("n"), "MultiDiscrete": description.get("nvec")}.get(kind)
    if kind == "MultiDiscrete":
        shape = np.shape(shape) if isinstance(shape, list) else None
    dims = [shape] if isinstance(shape, int) else shape
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return 0  # not a shape: the parser refuses it
    return math.prod(dims)


def require_policy_fits_env(meta: dict[str, Any], env_id: str, run_dir: Any) -> None:
    """Raise unless a checkpoint's policy takes the observations and gives the actions of
    the env it names, registered as `env_id` (a checkpoint.json edited to another env fails
    here, not mid-evaluation)."""
    from rlpipe.envs import env_spaces
    from rlpipe.envs.goals import flat_observation_space

    obs_space, act_space = env_spaces(env_id)
    if is_goal_space(obs_space):
        obs_space = flat_observation_space(obs_space)
    saved = space_from_json(meta["action_space"], f"{Path(run_dir) / 'checkpoint.json'} 'action_space'")
    obs_dim = meta["policy"]["spec"].get("obs_dim")
    same_actions = type(saved) is type(act_space) and (
        saved.n == cast(spaces.Discrete, act_space).n if isinstance(saved, spaces.Discrete) else saved.shape == act_space.shape
    )
    if obs_dim != int(np.prod(obs_space.shape)) or not same_actions:  # type: ignore[arg-type]  # shape is None only for non-goal Dicts
        raise RlpipeError(
            f"checkpoint in {run_dir} does not fit {env_id}: the policy takes {obs_dim} observation values and "
            f"acts in {saved}, the env has observations {obs_space.shape} and actions {act_space}"
        )
