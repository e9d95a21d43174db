"""Safe checkpoints: tensors in safetensors, everything else in JSON; nothing is unpickled.

A run directory holds ``model.safetensors`` (every module's state, keys prefixed with the
module name, e.g. ``policy.net.0.weight``) and ``checkpoint.json`` (algorithm, env id,
action space, policy kind/spec, config and the sha256 of the weights file). The hash is
what dataset metadata records as the producing expert's identity.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from rlpipe.errors import ArgumentError, RlpipeError
from rlpipe.storage.files import atomic_output, atomic_write_text, loads_json, read_limited, sha256_file

WEIGHTS_FILE = "model.safetensors"
META_FILE = "checkpoint.json"
FORMAT_VERSION = 1
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def save_checkpoint(run_dir: str | Path, modules: dict[str, nn.Module], meta: dict[str, Any]) -> str:
    """Write ``modules``' state dicts and ``meta`` (JSON-serialisable) to ``run_dir``.

    Returns the sha256 of the weights file, also stored in ``checkpoint.json``. Files are
    written to temporaries and renamed, so an interrupted save never leaves a half file.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{name}.{key}": value.detach().to("cpu").contiguous().clone()
        for name, module in modules.items()
        for key, value in module.state_dict().items()
    }
    weights = run_dir / WEIGHTS_FILE
    with atomic_output(weights) as tmp:
        save_file(tensors, str(tmp), metadata={"format": str(FORMAT_VERSION)})
    digest = sha256_file(weights)
    record = {"format": FORMAT_VERSION, **meta, "weights_file": WEIGHTS_FILE, "sha256": digest}
    atomic_write_text(run_dir / META_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return digest


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its JSON record and its tensors (on the requested device)."""

    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def sha256(self) -> str:
        return self.meta["sha256"]

    def state_dict(self, module_name: str) -> dict[str, torch.Tensor]:
        """The state dict saved for ``module_name`` (prefix stripped)."""
        prefix = module_name + "."
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def read_meta(run_dir: str | Path) -> dict[str, Any]:
    """Read and check ``checkpoint.json``; a missing or malformed file is an RlpipeError (a
    directory with none an `ArgumentError`: a ValueError to Python callers who named it)."""
    path = Path(run_dir) / META_FILE
    if not path.is_file():
        raise ArgumentError(f"no checkpoint in {run_dir} (missing {META_FILE})")
    try:
        meta = loads_json(read_limited(path, follow_links=True))
    except (ValueError, RecursionError) as exc:  # malformed JSON, NaN or Infinity, bad UTF-8
        raise RlpipeError(f"corrupted checkpoint metadata {path}: {exc}") from None
    except OSError as exc:
        raise RlpipeError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise RlpipeError(f"unsupported checkpoint format {meta.get('format') if isinstance(meta, dict) else None!r} in {path}")
    problem = _meta_problem(meta)
    if problem:
        raise RlpipeError(f"corrupted checkpoint metadata {path}: {problem}")
    return meta


def _meta_problem(meta: dict[str, Any]) -> str | None:
    """The first thing wrong with a parsed checkpoint record, or None."""
    for key in ("algo", "env_id", "weights_file", "sha256"):
        if not isinstance(meta.get(key), str):
            return f"{key!r} is missing or not a string"
    if not _FILE_NAME_RE.match(meta["weights_file"]):
        return f"weights_file {meta['weights_file']!r} is not a file name in the run directory"
    if not _SHA256_RE.match(meta["sha256"]):
        return "'sha256' is not a sha256 hex digest"
    policy = meta.get("policy")
    if not (isinstance(policy, dict) and isinstance(policy.get("kind"), str) and isinstance(policy.get("spec"), dict)):
        return "'policy' needs a kind and a spec"
    # The kind is checked where the policy is rebuilt (build_policy): its class registers on import of its algorithm's module.
    space = meta.get("action_space")
    if not (isinstance(space, dict) and space.get("type") in ("Discrete", "Box")):
        return "'action_space' is missing or not a Discrete or Box description"
    config = meta.get("config", {})
    if not isinstance(config, dict):
        return "'config' is not an object"
    for key in ("dataset", "store"):  # where an offline run's dataset is found again (`rlpipe eval`'s normalised score)
        if not isinstance(config.get(key), (str, type(None))):
            return f"'config.{key}' is not a string or null"
    return None


def load_checkpoint(run_dir: str | Path, device: str | torch.device = "cpu", verify: bool = True) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint`, checking the weights' sha256."""
    meta = read_meta(run_dir)
    weights = Path(run_dir) / meta["weights_file"]
    if not weights.is_file():
        raise RlpipeError(f"checkpoint weights missing: {weights}")
    if verify and sha256_file(weights) != meta["sha256"]:
        raise RlpipeError(f"checkpoint weights {weights} do not match their recorded sha256 (corrupted or replaced)")
    try:
        tensors = load_file(str(weights), device=str(device))
    except (SafetensorError, OSError) as exc:
        raise RlpipeError(f"cannot read checkpoint weights {weights}: {exc}") from None
    return Checkpoint(meta=meta, tensors=tensors)
