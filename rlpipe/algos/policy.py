"""Loading a trained policy from a run directory (checkpoint + JSON meta, nothing unpickled)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.errors import ArgumentError, RlpipeError

if TYPE_CHECKING:
    from rlpipe.nets.checkpoint import Checkpoint


@dataclass
class LoadedPolicy:
    """A trained policy: call it on a batch of observations to get env-scaled actions.

    A policy that reads stacks of ``frame_stack`` frames stacks one observation per env
    itself; a loop stepping envs reports which envs start an episode with
    ``start_episodes(rows)`` (`rlpipe.training.evaluation.ActorPolicy`), and each step's
    rewards with ``record_rewards(rewards)`` (a return-conditioned policy's, `rlpipe.algos.dt`)."""

    algo: str
    env_id: str
    checkpoint_sha256: str
    run_dir: Path
    action_space: spaces.Space
    config: dict[str, Any]
    actor: torch.nn.Module = field(repr=False)
    _fn: Any = field(repr=False)
    # A run on data with no environment (env_id ""): the observations it takes, from the data.
    observation_space: spaces.Space | None = None

    def played_in(self, env_id: str | None = None) -> str:
        """The env to play the policy in: ``env_id`` when given, else the one it learned in; a
        policy that learned from data with no environment has none of its own."""
        if env_id or self.env_id:
            return env_id or self.env_id
        raise RlpipeError(f"the {self.algo} run in {self.run_dir} learned from data with no environment: there is none to play it in")

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        try:
            return self._fn(obs)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:  # torch's shape errors name no argument
            found = getattr(obs, "shape", type(obs).__name__)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ArgumentError(f"obs of shape {found} does not fit the {self.algo} policy of {self.env_id} ({first})") from exc

    @property
    def frame_stack(self) -> int:
        return getattr(self._fn, "frame_stack", 1)

    def start_episodes(self, rows: np.ndarray) -> None:
        """Mark the envs whose next observation starts an episode (a policy without state ignores it)."""
        start = getattr(self._fn, "start_episodes", None)
        if start is not None:
            start(rows)

    def record_rewards(self, rewards: np.ndarray) -> None:
        """Report each env's reward for the last action (a policy that does not condition on them ignores it)."""
        record = getattr(self._fn, "record_rewards", None)
        if record is not None:
            record(rewards)


def load_checkpoint_policy(
    run_dir: str | Path, device: str = "cpu", deterministic: bool = True, policy_of: Callable[..., Any] | None = None
) -> LoadedPolicy:
    """Load the policy of any saved run (``rlpipe train ... --out RUN_DIR``).

    The result maps a batch of observations ``[B, *obs_shape]`` (or a goal env's Dict of
    batches, flattened as in training; or frame stacks ``[B, k, *obs_shape]``) to a batch of env actions
    (scaled to the env's bounds / Discrete indices); ``.env_id`` and
    ``.checkpoint_sha256`` identify it. Nothing is unpickled; the weights' hash is checked;
    an env spec naming code not registered here needs `--trust-env-spec`.
    ``policy_of(actor, scaler, device, deterministic)`` makes the policy function (default
    `rlpipe.training.evaluation.policy_fn`): an algorithm's loader passes its own.
    """
    from rlpipe.envs import recorded_env_id
    from rlpipe.envs.spaces import require_policy_fits_env
    from rlpipe.nets.checkpoint import load_checkpoint
    from rlpipe.training.env import ActionScaler, resolve_device, space_from_json
    from rlpipe.training.evaluation import policy_fn

    dev = resolve_device(device)
    ckpt = load_checkpoint(run_dir, dev)
    meta = ckpt.meta
    observation_space = None
    if meta["env_id"] == "" and "observation_space" in meta:  # learned from data with no environment (rlpipe.training.validation)
        env_id, observation_space = "", space_from_json(meta["observation_space"], f"{run_dir}/checkpoint.json 'observation_space'")
    else:
        env_id = recorded_env_id(meta["env_id"], meta.get("env_spec"), f"the run in {run_dir}")
        require_policy_fits_env(meta, env_id, run_dir)
    actor = rebuild_actor(ckpt, run_dir, dev)
    space = space_from_json(meta["action_space"])
    fn = (policy_of or policy_fn)(actor, ActionScaler(space), dev, deterministic)
    return LoadedPolicy(meta["algo"], env_id, ckpt.sha256, Path(run_dir), space, meta.get("config", {}), actor, fn, observation_space)


def rebuild_actor(ckpt: Checkpoint, run_dir: str | Path, device: torch.device) -> torch.nn.Module:
    """A checkpoint's policy network with its weights, in eval mode. Its class must be
    registered: the loaders run after :func:`rlpipe.algos.registry.import_algorithm`."""
    from rlpipe.nets.networks import build_policy, policy_shapes

    kind, spec, weights = ckpt.meta["policy"]["kind"], ckpt.meta["policy"]["spec"], ckpt.state_dict("policy")
    needed, saved = policy_shapes(kind, spec), {key: tuple(value.shape) for key, value in weights.items()}
    if needed != saved:
        key = min(key for key in needed.keys() | saved.keys() if needed.get(key) != saved.get(key))
        raise RlpipeError(
            f"checkpoint in {run_dir} does not match its policy spec: tensor {key!r} is {list(saved[key]) if key in saved else 'missing'}"
            f" in the weights, {list(needed[key]) if key in needed else 'not a tensor'} in the spec"
        )
    actor = build_policy(kind, spec).to(device)
    try:
        actor.load_state_dict(weights)
    except RuntimeError as exc:
        raise RlpipeError(f"checkpoint in {run_dir} does not match its policy spec: {str(exc).splitlines()[0]}") from None
    return actor.eval()


def refuse_planner_policy(run_dir: str | Path, device: str = "cpu", deterministic: bool = True) -> LoadedPolicy:
    """The loader of planner runs (PETS, the dynamics trainer): their checkpoint holds a
    dynamics model, their actions come from planning with it, so there is no policy network
    to load; always an RlpipeError saying so."""
    from rlpipe.nets.checkpoint import read_meta

    meta = read_meta(run_dir)
    raise RlpipeError(
        f"the {meta['algo']} run in {run_dir} has no policy network to load (it saved a "
        f"{meta.get('policy', {}).get('kind', 'model')}; its actions come from planning)"
    )


__all__ = ["LoadedPolicy", "load_checkpoint_policy", "rebuild_actor", "refuse_planner_policy"]
