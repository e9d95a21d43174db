"""The torch side of meeting an env: which device a run uses, which encoder reads its observations.

Env construction, space checks, action rescaling and the space JSON live in
``rlpipe.envs`` (torch-free). The names below are re-exported only for the modules that
still import them from here (algos/*, cli/train.py, training/run.py, training/offpolicy.py,
training/offline.py); new code imports
them from ``rlpipe.envs``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.envs import env_spaces, make_vec_env
from rlpipe.envs.spaces import (
    BOX,
    DISCRETE,
    GOAL,
    IMAGE,
    ActionScaler,
    action_dim,
    is_image_space,
    require_spaces,
    space_from_json,
    space_to_json,
)
from rlpipe.errors import ArgumentError, RlpipeError
from rlpipe.nets.encoders import ARCHITECTURES, FLAT, MINATAR, NATURE, NATURE_MIN_SIZE, channels_last
from rlpipe.training.config import check_device

__all__ = [
    "BOX",
    "DISCRETE",
    "GOAL",
    "IMAGE",
    "ActionScaler",
    "action_dim",
    "encoder_spec",
    "env_spaces",
    "make_vec_env",
    "require_spaces",
    "resolve_device",
    "space_from_json",
    "space_to_json",
]


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cuda`` without a GPU is an RlpipeError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ArgumentError(f"--device {device} requested but no CUDA device is available; use --device cpu")
    return torch.device(device)


def encoder_spec(obs_space: spaces.Space, frame_stack: int = 1, arch: str = "auto") -> dict[str, Any] | None:
    """The JSON description of the encoder for observations of ``obs_space`` stacked
    ``frame_stack`` deep, or None where the observation goes to the MLP as it is (a flat
    vector, unstacked). ``arch``: "auto" (Nature CNN for frames of 36 x 36 or more, else
    MinAtar's CNN), or one of :data:`ARCHITECTURES` (images only)."""
    if frame_stack < 1:
        raise RlpipeError(f"frame_stack must be 1 or more, got {frame_stack}")
    shape = [int(d) for d in obs_space.shape] if isinstance(obs_space, spaces.Box) else []
    if not is_image_space(obs_space):
        if len(shape) != 1:
            raise RlpipeError(f"no encoder reads observations of {obs_space}: a flat Box or an image is needed")
        return None if frame_stack == 1 else {"arch": FLAT, "shape": shape, "frame_stack": frame_stack, "scale": 1.0}
    if arch not in ("auto", *ARCHITECTURES):
        raise RlpipeError(f"unknown encoder {arch!r}; choose from auto, {', '.join(ARCHITECTURES)}")
    height, width = (shape[0], shape[1]) if channels_last(shape) else (shape[1], shape[2])
    if arch == "auto":
        arch = NATURE if min(height, width) >= NATURE_MIN_SIZE else MINATAR
    if arch == NATURE and min(height, width) < NATURE_MIN_SIZE:
        raise RlpipeError(f"the Nature CNN needs frames of at least {NATURE_MIN_SIZE} x {NATURE_MIN_SIZE}; these are {height} x {width}")
    scale = 255.0 if np.dtype(obs_space.dtype) == np.uint8 else 1.0
    return {"arch": arch, "shape": shape, "frame_stack": frame_stack, "scale": scale}
