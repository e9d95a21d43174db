"""The torch side of meeting an env: which device a run uses.

Env construction, space checks, action rescaling and the space JSON live in
``rlpipe.envs`` (torch-free). The names below are re-exported only for the modules that
still import them from here (algos/*, cli/train.py, training/run.py, training/offpolicy.py,
training/offline.py); new code imports
them from ``rlpipe.envs``.
"""

from __future__ import annotations

import torch

from rlpipe.envs import env_spaces, make_vec_env
from rlpipe.envs.spaces import BOX, DISCRETE, GOAL, ActionScaler, action_dim, require_spaces, space_from_json, space_to_json
from rlpipe.errors import RlpipeError

__all__ = [
    "BOX",
    "DISCRETE",
    "GOAL",
    "ActionScaler",
    "action_dim",
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
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RlpipeError(f"--device {device} requested but no CUDA device is available; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise RlpipeError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)
