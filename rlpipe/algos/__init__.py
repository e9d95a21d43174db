"""Algorithm registry (name -> module) and loading of trained policies.

Every algorithm module exposes ``Config`` (a dataclass), ``TUNED`` (per-env defaults),
``make_config(env_id, **overrides)``, ``ACTION_SPACES`` and
``train(config, out_dir=None, *, progress=True, ...) -> TrainResult``; optionally
``OBSERVATION_SPACES`` (default: flat Box only). A module serving several names (her.py)
has ``variant(name)``, which returns that contract for one name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.errors import RlpipeError

ONLINE = ("ppo", "sac", "ddpg", "td3", "ddpg-her", "td3-her", "sac-her", "pets", "mbpo")
# Offline algorithms read ``--dataset``; the env they are evaluated in comes from its metadata.
OFFLINE: tuple[str, ...] = ("bc", "gail", "cql", "bcq", "td3bc", "iql", "dynamics", "mopo")
# name -> module; a module may serve several names (the HER variants share one file).
REGISTRY: dict[str, str] = {
    **{name: f"rlpipe.algos.{name}" for name in ("ppo", "sac", "ddpg", "td3", "bc", "gail", "cql", "bcq", "iql", "pets", "mbpo", "dynamics", "mopo")},
    "td3bc": "rlpipe.algos.td3_bc",
    **{f"{base}-her": "rlpipe.algos.her" for base in ("ddpg", "td3", "sac")},
}


def get_algo(name: str) -> ModuleType:
    """The algorithm module for ``name`` (its per-name view if it serves several names);
    unknown names are an RlpipeError."""
    if name not in REGISTRY:
        raise RlpipeError(f"unknown algorithm {name!r}; choose from {', '.join(sorted(REGISTRY))}")
    module = importlib.import_module(REGISTRY[name])
    return module.variant(name) if hasattr(module, "variant") else module


@dataclass
class LoadedPolicy:
    """A trained policy: call it on a batch of observations to get env-scaled actions."""

    algo: str
    env_id: str
    checkpoint_sha256: str
    run_dir: Path
    action_space: spaces.Space
    config: dict[str, Any]
    actor: torch.nn.Module = field(repr=False)
    _fn: Any = field(repr=False)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self._fn(obs)


def load_policy(run_dir: str | Path, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """Load the policy of any saved run (``rlpipe train ... --out RUN_DIR``).

    The result maps a batch of observations ``[B, obs_dim]`` (or a goal env's Dict of
    batches, flattened as in training) to a batch of env actions
    (scaled to the env's bounds / Discrete indices); ``.env_id`` and
    ``.checkpoint_sha256`` identify it. Nothing is unpickled; the weights' hash is checked.
    """
    from rlpipe.models.checkpoint import load_checkpoint
    from rlpipe.models.networks import POLICY_CLASSES, build_policy
    from rlpipe.training.env import ActionScaler, resolve_device, space_from_json
    from rlpipe.training.evaluation import policy_fn

    dev = resolve_device(device)
    ckpt = load_checkpoint(run_dir, dev)
    meta = ckpt.meta
    if meta["policy"]["kind"] not in POLICY_CLASSES:  # e.g. PETS: actions come from planning
        raise RlpipeError(f"the {meta['algo']} run in {run_dir} has no policy network to load (it saved a {meta['policy']['kind']})")
    actor = build_policy(meta["policy"]["kind"], meta["policy"]["spec"]).to(dev)
    try:
        actor.load_state_dict(ckpt.state_dict("policy"))
    except RuntimeError as exc:
        raise RlpipeError(f"checkpoint in {run_dir} does not match its policy spec: {str(exc).splitlines()[0]}") from None
    actor.eval()
    space = space_from_json(meta["action_space"])
    fn = policy_fn(actor, ActionScaler(space), dev, deterministic)
    return LoadedPolicy(meta["algo"], meta["env_id"], ckpt.sha256, Path(run_dir), space, meta.get("config", {}), actor, fn)


__all__ = ["LoadedPolicy", "ONLINE", "OFFLINE", "REGISTRY", "get_algo", "load_policy"]
