"""Shipping a trained policy: the deterministic policy of a run as ONNX or TorchScript.

The exported graph is the whole path from an observation to an env action: observation
normalisation (inside the actor), the network, the deterministic action (tanh mean, argmax)
and the action scaling to the env's bounds (Box) or index offset (Discrete), so a consumer
needs no rlpipe code. Goal envs' Dict observations enter flattened as in training:
``concat(observation, desired_goal)``. Each file carries the observation and action spaces
(Minari's JSON form), the algorithm, the env id and the checkpoint's sha256 as metadata.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from minari.serialization import serialize_space

import rlpipe
from rlpipe.algos import LoadedPolicy, load_policy
from rlpipe.errors import RlpipeError
from rlpipe.files import atomic_output

# Policies whose deterministic action is a function of the observation alone.
EXPORTABLE_KINDS = ("tanh_gaussian", "deterministic", "categorical", "actor_critic", "greedy_q")
METADATA_FILE = "rlpipe.json"  # TorchScript's extra file with the metadata


class DeployedPolicy(torch.nn.Module):
    """Observation batch [B, obs_dim] (float32) -> env action batch, deterministic."""

    def __init__(self, actor: torch.nn.Module, action_space: spaces.Space) -> None:
        super().__init__()
        self.actor = actor
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            self.start = int(action_space.start)
            return
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        bounded = np.isfinite(low) & np.isfinite(high)
        self.register_buffer("low", torch.as_tensor(np.where(bounded, low, -1.0), dtype=torch.float32))
        self.register_buffer("span", torch.as_tensor(np.where(bounded, high - low, 2.0), dtype=torch.float32))
        self.register_buffer("bounded", torch.as_tensor(bounded))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.actor.act(obs, True)
        if self.discrete:
            return action.to(torch.int64) + self.start
        scaled = self.low + (action.clamp(-1.0, 1.0) + 1.0) * 0.5 * self.span  # as ActionScaler.to_env
        return torch.where(self.bounded, scaled, action)


def _deployable(run_dir: str | os.PathLike) -> tuple[LoadedPolicy, DeployedPolicy, dict[str, Any]]:
    policy = load_policy(run_dir)
    kind = getattr(policy.actor, "kind", None)
    if kind not in EXPORTABLE_KINDS:
        raise RlpipeError(
            f"the {policy.algo} run in {run_dir} cannot be exported: its {kind} policy samples candidate actions "
            "even when acting deterministically"
        )
    if policy.action_space.dtype not in (np.float32, np.int64) and not isinstance(policy.action_space, spaces.Discrete):
        raise RlpipeError(f"the run in {run_dir} acts in {policy.action_space.dtype}; export supports float32 Box and Discrete actions")
    from rlpipe.training.env import env_spaces

    observation_space = env_spaces(policy.env_id)[0]
    metadata = {
        "algo": policy.algo,
        "env_id": policy.env_id,
        "checkpoint_sha256": policy.checkpoint_sha256,
        "observation_space": serialize_space(observation_space),
        "action_space": serialize_space(policy.action_space),
        "input": "obs: float32 [batch, obs_dim]"
        + (" = concat(observation, desired_goal)" if isinstance(observation_space, spaces.Dict) else ""),
        "rlpipe_version": rlpipe.__version__,
    }
    model = DeployedPolicy(policy.actor, policy.action_space).eval().requires_grad_(False)  # outputs need no graph
    return policy, model, metadata


def _example_input(policy: LoadedPolicy) -> torch.Tensor:
    return torch.zeros(2, policy.actor.spec["obs_dim"], dtype=torch.float32)


def _check_output(path: Path, force: bool) -> None:
    if path.is_dir() or path.is_symlink():
        raise RlpipeError(f"{path} is a directory or a symbolic link; choose a file name")
    if path.exists() and not force:
        raise RlpipeError(f"{path} already exists (use --force to replace it)")
    if not path.parent.is_dir():
        raise RlpipeError(f"directory {path.parent} does not exist")


def export_onnx(run_dir: str | os.PathLike, path: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Write the run's deterministic policy to `path` as ONNX (input `obs`, output `action`,
    dynamic batch); returns the metadata stored in the file."""
    import onnx

    path = Path(path)
    _check_output(path, force)
    policy, model, metadata = _deployable(run_dir)
    with atomic_output(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        torch.onnx.export(
            model,
            (_example_input(policy),),
            str(tmp),
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            dynamo=False,
        )
        graph = onnx.load(str(tmp))
        for key, value in metadata.items():
            graph.metadata_props.add(key=key, value=str(value))
        onnx.save(graph, str(tmp))
    return metadata


def export_torchscript(run_dir: str | os.PathLike, path: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Write the run's deterministic policy to `path` as TorchScript (`torch.jit.load`), with
    the metadata in its extra file `rlpipe.json`; returns that metadata."""
    path = Path(path)
    _check_output(path, force)
    policy, model, metadata = _deployable(run_dir)
    with atomic_output(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (_example_input(policy),), check_trace=False)
        torch.jit.save(traced, str(tmp), _extra_files={METADATA_FILE: json.dumps(metadata)})
    return metadata


__all__ = ["DeployedPolicy", "EXPORTABLE_KINDS", "export_onnx", "export_torchscript"]
