"""Env families that live in optional packages, and the rlpipe extra that brings each.

Gymnasium registers its MuJoCo ids (Hopper-v5, ...) always and fails only when one is
built without `mujoco`; the robotics ids (FetchReach-v4, ...), MinAtar's (MinAtar/Breakout-v1,
...) and the Atari ones (ALE/Pong-v5, rlpipe/Pong-atari-v5: rlpipe.envs.atari) exist only once
their package registered them, which rlpipe does the first time one is used. Either way the
user gets one line naming the extra.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium as gym

from rlpipe.envs.atari import is_atari_id, register_atari_envs
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
    """The rlpipe extra an env id needs (`mujoco`, `robotics`, `minatar`, `atari`), or None."""
    if env_id.startswith("MinAtar/"):
        return "minatar"
    if is_atari_id(env_id):
        return "atari"
    name = env_id.split("/")[-1].split("-v")[0]
    if name.startswith(ROBOTICS_PREFIXES):
        return "robotics"
    return "mujoco" if name in MUJOCO_NAMES else None


def register_optional(env_id: str) -> None:
    """Register the env family of `env_id` (robotics, MinAtar, Atari) when it is one of theirs
    and not registered yet; one line naming the extra when its package is missing."""
    extra = extra_for(env_id)
    if env_id in gym.registry or extra not in _REGISTER:
        return
    try:
        _REGISTER[extra](env_id)
    except ImportError:
        raise RlpipeError(f"environment {env_id!r} needs the {extra} extra: {EXTRA_INSTALL.format(extra=extra)}") from None


def _register_robotics(env_id: str) -> None:
    with _quiet_adroit_notices(env_id):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)


def _register_minatar(env_id: str) -> None:
    with _quiet_seaborn_notice():
        from minatar.gym import register_envs
    register_envs()


_REGISTER = {"robotics": _register_robotics, "minatar": _register_minatar, "atari": lambda env_id: register_atari_envs()}


@contextmanager
def _quiet_seaborn_notice() -> Iterator[None]:
    """Hide the warning minatar logs, through the root logger, when seaborn (needed only to
    render its frames) is missing: a placeholder handler keeps logging from configuring the
    root logger to print it, and a filter keeps the user's own handlers from printing it."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()

    def not_seaborn(record: logging.LogRecord) -> bool:
        return "seaborn" not in record.getMessage()

    root.addHandler(placeholder)
    root.addFilter(not_seaborn)
    try:
        yield
    finally:
        root.removeFilter(not_seaborn)
        root.removeHandler(placeholder)


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
