"""Shipping a trained policy: the deterministic policy of a run as ONNX or TorchScript.

The exported graph is the whole path from an observation to an env action: observation
normalisation (inside the actor), the network, the deterministic action (tanh mean, argmax)
and the action scaling to the env's bounds (Box) or index offset (Discrete), so a consumer
needs no rlpipe code. Goal envs' Dict observations enter flattened as in training:
``concat(observation, desired_goal)``; a policy with an image encoder (DQN on MinAtar or
Atari) reads the frames in the env's shape and dtype (bool, uint8), ``[batch, k, *frame]``
when it was trained on stacks of k frames. A recurrent policy's graph also takes each
row's hidden state and returns the next one (``(obs, state) -> (action, next_state)``; zeros
start an episode). Each file carries the observation and action spaces
(Minari's JSON form), the algorithm, the env id and the checkpoint's sha256 as metadata.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from minari.serialization import serialize_space

from rlpipe.algos import LoadedPolicy, load_policy
from rlpipe.envs.spaces import is_image_space
from rlpipe.errors import RlpipeError
from rlpipe.nets.recurrent import RecurrentPolicy
from rlpipe.storage.files import atomic_output, check_output_file
from rlpipe.version import __version__

# Policies whose deterministic action is a function of the observation alone.
EXPORTABLE_KINDS = (
    "tanh_gaussian",
    "deterministic",
    "normal",
    "categorical",
    "actor_critic",
    "greedy_q",
    "discrete_bcq",
    "recurrent_actor_critic",
    "recurrent_categorical",
)
# Why the other kinds cannot be exported as one observation -> action graph (default: continuous BCQ's reason).
UNEXPORTABLE_REASONS = {
    "decision_transformer": "acts on its episode's recent returns-to-go, observations and actions, not on one observation"
}
METADATA_FILE = "rlpipe.json"  # TorchScript's extra file with the metadata


class EnvActions(torch.nn.Module):
    """Policy actions -> env actions, as ``ActionScaler.to_env``: Discrete indices offset by
    the space's start, Box actions in [-1, 1] scaled to its finite bounds."""

    low: torch.Tensor  # buffers (register_buffer) of a Box
    span: torch.Tensor
    bounded: torch.Tensor

    def __init__(self, action_space: spaces.Space) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            self.start = int(cast(spaces.Discrete, action_space).start)
            return
        box = cast(spaces.Box, action_space)  # exported policies act in Discrete or Box spaces
        low, high = np.asarray(box.low, np.float64), np.asarray(box.high, np.float64)
        bounded = np.isfinite(low) & np.isfinite(high)
        self.register_buffer("low", torch.as_tensor(np.where(bounded, low, -1.0), dtype=torch.float32))
        self.register_buffer("span", torch.as_tensor(np.where(bounded, high - low, 2.0), dtype=torch.float32))
        self.register_buffer("bounded", torch.as_tensor(bounded))

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return action.to(torch.int64) + self.start
        scaled = self.low + (action.clamp(-1.0, 1.0) + 1.0) * 0.5 * self.span
        return torch.where(self.bounded, scaled, action)


class DeployedPolicy(torch.nn.Module):
    """Observation batch [B, *obs_shape] (``obs_dtype``; default flat float32) -> env action batch, deterministic."""

    input_names: tuple[str, ...] = ("obs",)
    output_names: tuple[str, ...] = ("action",)

    def __init__(
        self,
        actor: torch.nn.Module,
        action_space: spaces.Space,
        obs_shape: tuple[int, ...] | None = None,
        obs_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.actor: Any = actor  # a policy class: act() and spec (recurrent ones: step() and initial_state())
        self.obs_shape = obs_shape or (int(cast("dict[str, Any]", actor.spec)["obs_dim"]),)
        self.obs_dtype = obs_dtype
        self.to_env = EnvActions(action_space)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.to_env(self.actor.act(obs, True))

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """A batch of two observations of the input's shape and dtype, to trace the graph with."""
        return (torch.zeros(2, *self.obs_shape, dtype=self.obs_dtype),)


class DeployedRecurrentPolicy(DeployedPolicy):
    """(observation batch [B, obs_dim], hidden states [B, n, hidden]) -> (env action batch,
    next hidden states), deterministic; zero states start episodes
    (:class:`rlpipe.nets.recurrent.RecurrentPolicy`)."""

    input_names = ("obs", "state")
    output_names = ("action", "next_state")

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        action, state = self.actor.step(obs, state, True)
        return self.to_env(action), state

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (*super().example_inputs(), self.actor.initial_state(2))


def input_layout(actor: torch.nn.Module, observation_space: spaces.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape of one observation the exported policy reads and its dtype: flat float32
    [obs_dim], or the frames its encoder reads ([k, *frame] when stacked) in the env's dtype."""
    spec = cast("dict[str, Any]", actor.spec)  # every policy class keeps its spec
    encoder = spec.get("encoder")
    if encoder is None:
        return (int(spec["obs_dim"]),), torch.float32
    frame, stack = tuple(encoder["shape"]), encoder["frame_stack"]
    dtype = torch.from_numpy(np.empty(0, observation_space.dtype)).dtype if is_image_space(observation_space) else torch.float32
    return ((stack, *frame) if stack > 1 else frame), dtype


def _deployable(run_dir: str | os.PathLike) -> tuple[LoadedPolicy, DeployedPolicy, dict[str, Any]]:
    policy = load_policy(run_dir)  # type: ignore[arg-type]  # any path: load_policy's annotation says str | Path
    kind = getattr(policy.actor, "kind", None)
    if kind not in EXPORTABLE_KINDS:
        reason = UNEXPORTABLE_REASONS.get(str(kind), "samples candidate actions even when acting deterministically")
        raise RlpipeError(f"the {policy.algo} run in {run_dir} cannot be exported: its {kind} policy {reason}")
    if policy.action_space.dtype not in (np.float32, np.int64) and not isinstance(policy.action_space, spaces.Discrete):
        raise RlpipeError(f"the run in {run_dir} acts in {policy.action_space.dtype}; export supports float32 Box and Discrete actions")
    from rlpipe.training.env import env_spaces

    observation_space = policy.observation_space or env_spaces(policy.env_id)[0]  # data with no env records its own
    obs_shape, obs_dtype = input_layout(policy.actor, observation_space)
    layout = "obs_dim" if cast("dict[str, Any]", policy.actor.spec).get("encoder") is None else ", ".join(map(str, obs_shape))
    metadata = {
        "algo": policy.algo,
        "env_id": policy.env_id,
        "checkpoint_sha256": policy.checkpoint_sha256,
        "observation_space": serialize_space(observation_space),
        "action_space": serialize_space(policy.action_space),
        "input": f"obs: {str(obs_dtype).removeprefix('torch.')} [batch, {layout}]"
        + (" = concat(observation, desired_goal)" if isinstance(observation_space, spaces.Dict) else ""),
        "rlpipe_version": __version__,
    }
    deployed = DeployedPolicy
    if isinstance(policy.actor, RecurrentPolicy):
        deployed = DeployedRecurrentPolicy
        state_shape = ", ".join(map(str, policy.actor.initial_state(1).shape[1:]))
        metadata["input"] += f"; state: float32 [batch, {state_shape}], zeros at an episode's start (output next_state)"
    model = deployed(policy.actor, policy.action_space, obs_shape, obs_dtype)
    return policy, model.eval().requires_grad_(False), metadata  # outputs need no graph


def _check_output(path: Path, force: bool, option: str) -> None:
    """Refuse ``option``'s file before anything is written: a link, a TorchScript name without
    an extension (torch.jit.save and torch.export.save name the archive inside after the name less its extension),
    what :func:`check_output_file` refuses, and an existing file without ``force``. A
    character device or a FIFO is written through, so it needs no ``force``."""
    if os.path.islink(path):  # not Path.is_symlink: a name too long is check_output_file's to refuse
        raise RlpipeError(f"{path} is a directory or a symbolic link; choose a file name")
    if option in ("--torchscript", "--program") and not path.suffix:
        kind, example = ("TorchScript", "policy.pt") if option == "--torchscript" else ("a torch.export program", "policy.pt2")
        raise RlpipeError(f"cannot write {path} ({option}): {kind} needs a file name with an extension, e.g. {example}")
    if not check_output_file(path, option) and path.exists() and not force:
        raise RlpipeError(f"{path} already exists (use --force to replace it)")


def _write_onnx(policy: LoadedPolicy, model: DeployedPolicy, metadata: dict[str, Any], tmp: Path) -> None:
    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        torch.onnx.export(
            model,
            model.example_inputs(),
            str(tmp),
            input_names=list(model.input_names),
            output_names=list(model.output_names),
            dynamic_axes={name: {0: "batch"} for name in model.input_names + model.output_names},
            dynamo=False,
        )
    graph = onnx.load(str(tmp))
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=str(value))
    onnx.save(graph, str(tmp))


def _write_torchscript(policy: LoadedPolicy, model: DeployedPolicy, metadata: dict[str, Any], tmp: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, model.example_inputs(), check_trace=False)
        torch.jit.save(traced, str(tmp), _extra_files={METADATA_FILE: json.dumps(metadata)})


def _write_program(policy: LoadedPolicy, model: DeployedPolicy, metadata: dict[str, Any], tmp: Path) -> None:
    """torch.export's program (torch 2.13 deprecates TorchScript): ``torch.export.load(path).module()``
    runs it; the batch dimension of every input is dynamic."""
    dynamic = {name: {0: torch.export.Dim.DYNAMIC} for name in model.input_names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, model.example_inputs(), dynamic_shapes=dynamic)
        torch.export.save(program, str(tmp), extra_files={METADATA_FILE: json.dumps(metadata)})


# Each output option and its writer, in the order outputs are written.
_WRITERS = {"--onnx": _write_onnx, "--torchscript": _write_torchscript, "--program": _write_program}


def export_policy(
    run_dir: str | os.PathLike,
    *,
    onnx: str | os.PathLike | None = None,
    torchscript: str | os.PathLike | None = None,
    program: str | os.PathLike | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write the run's deterministic policy as ONNX to `onnx` (input `obs`, output `action`,
    dynamic batch; a recurrent policy also takes `state` and returns `next_state`), as
    TorchScript to `torchscript` (`torch.jit.load`) and/or as a torch.export program to
    `program` (`torch.export.load(path).module()`; the metadata in the last two's extra file
    `rlpipe.json`); returns the metadata stored in the files.

    Every output is checked before anything is written, and all are written to temporary
    files first: when one is refused or fails, none is written."""
    named = {"--onnx": onnx, "--torchscript": torchscript, "--program": program}
    outputs = [(option, Path(path)) for option, path in named.items() if path is not None]
    if not outputs:
        raise RlpipeError("nothing to export: give --onnx FILE, --torchscript FILE and/or --program FILE")
    for option, path in outputs:
        _check_output(path, force, option)
    resolved = [path.resolve() for _, path in outputs]
    if len(set(resolved)) < len(resolved):
        twice = next(path for path in resolved if resolved.count(path) > 1)
        raise RlpipeError(f"two outputs name {twice}; give one file each")
    policy, model, metadata = _deployable(run_dir)
    with ExitStack() as stack:  # every file is renamed into place only once all were written
        for option, path in outputs:
            _WRITERS[option](policy, model, metadata, stack.enter_context(atomic_output(path)))
    return metadata


def export_onnx(run_dir: str | os.PathLike, path: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Write the run's deterministic policy to `path` as ONNX (see `export_policy`)."""
    return export_policy(run_dir, onnx=path, force=force)


def export_program(run_dir: str | os.PathLike, path: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Write the run's deterministic policy to `path` as a torch.export program (see `export_policy`)."""
    return export_policy(run_dir, program=path, force=force)


def export_torchscript(run_dir: str | os.PathLike, path: str | os.PathLike, force: bool = False) -> dict[str, Any]:
    """Write the run's deterministic policy to `path` as TorchScript (see `export_policy`)."""
    return export_policy(run_dir, torchscript=path, force=force)


__all__ = ["DeployedPolicy", "EXPORTABLE_KINDS", "export_onnx", "export_policy", "export_program", "export_torchscript"]
