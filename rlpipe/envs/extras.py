"""Env families that live in optional packages, and the rlpipe extra that brings each.

Gymnasium registers its MuJoCo ids (Hopper-v5, ...) always and fails only when one is
built without `mujoco`; the robotics ids (FetchReach-v4, ...) exist only once
`gymnasium_robotics` registered them. Either way the user gets one line naming the extra.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium as gym

from rlpipe.errors import RlpipeError

EXTRA_INSTALL = "pip install -c constraints.txt -e '.[{extra}]'"
_ADROIT = "AdroitHand"  # the envs the robotics package's import notices are about
ROBOTICS_PREFIXES = ("Fetch", "HandReach", "HandManipulate", "AdroitHand", "PointMaze", "AntMaze", "FrankaKitchen")
MUJOCO_NAMES = (
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
)


def extra_for(env_id: str) -> str | None:
    """The rlpipe extra an env id needs (`mujoco`, `robotics`), or None."""
    name = env_id.split("/")[-1].split("-v")[0]
    if name.startswith(ROBOTICS_PREFIXES):
        return "robotics"
    return "mujoco" if name in MUJOCO_NAMES else None


def register_optional(env_id: str) -> None:
    """Register the robotics envs when `env_id` is one of theirs and not registered yet."""
    if env_id in gym.registry or extra_for(env_id) != "robotics":
        return
    try:
        with _quiet_adroit_notices(env_id):
            import gymnasium_robotics
    except ImportError:
        raise RlpipeError(f"environment {env_id!r} needs the robotics extra: {EXTRA_INSTALL.format(extra='robotics')}") from None
    gym.register_envs(gymnasium_robotics)


@contextmanager
def _quiet_adroit_notices(env_id: str) -> Iterator[None]:
    """Hide what importing gymnasium_robotics says about its Adroit envs (a notice printed to
    stderr, older versions' warnings: their rewards changed between versions) from users of
    the other robotics envs; anything else it prints is passed on, and Adroit users see it all."""
    if env_id.split("/")[-1].startswith(_ADROIT):
        yield
        return
    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(printed):
            warnings.filterwarnings("ignore", message=f".*{_ADROIT}")
            yield
    finally:
        kept = [line for line in printed.getvalue().splitlines(keepends=True) if _ADROIT not in line]
        sys.stderr.write("".join(kept))


def missing_dependency_message(env_id: str, detail: str) -> str:
    """The one line for an env whose package is not installed."""
    extra = extra_for(env_id)
    if extra is None:
        return f"environment {env_id!r} needs an extra dependency: {detail}"
    return f"environment {env_id!r} needs the {extra} extra: {EXTRA_INSTALL.format(extra=extra)}"
