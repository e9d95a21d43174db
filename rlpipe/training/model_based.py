"""What the model-based algorithms (PETS, MBPO, MOPO, the dynamics trainer) share: the
ensemble settings, fitting it on transitions, loading a saved one, branched model rollouts
into a buffer, and minibatches mixing real and model transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.errors import RlpipeError
from rlpipe.nets.checkpoint import load_checkpoint
from rlpipe.nets.dynamics import FitReport, GaussianEnsemble, fit_ensemble, transitions_to_xy
from rlpipe.training.buffer import Batch, ReplayBuffer, join_batches
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.env import ActionScaler
from rlpipe.training.offline import OfflineData
from rlpipe.training.planning import ModelEnv

DYNAMICS_MODULE = "dynamics"  # the ensemble's name in a checkpoint
Sampler = Callable[[int], Batch]


@dataclass
class ModelFields:
    """The dynamics ensemble and its fit, in a run's config (PETS, MBPO, MOPO, dynamics).

    ``reward``: "known" plans/rolls out with the env's reward function
    (:mod:`rlpipe.nets.env_fns`), "learned" with the model's predicted reward, "auto" with
    the known one where the env has it. The fit runs to early stopping unless
    ``model_max_epochs`` caps it; its weight decay is the references' (see
    :mod:`rlpipe.nets.dynamics`).
    """

    reward: Literal["auto", "known", "learned"] = "auto"
    members: int = positive(5)
    elites: int = positive(5)  # the members with the lowest holdout error, used for planning and rollouts
    model_hidden: tuple[int, ...] = layer_sizes((200, 200, 200, 200))  # the text's 4 x 200 Swish
    model_lr: float = positive(1e-3)
    model_batch_size: int = positive(256)
    model_max_epochs: int | None = positive(None)
    model_patience: int = positive(5)
    holdout_fraction: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]  # the run config next in the MRO checks its fields
        if self.elites > self.members:
            raise RlpipeError(f"setting elites={self.elites}: expected at most members ({self.members})")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise RlpipeError(f"setting holdout_fraction={self.holdout_fraction}: expected a number in [0, 1)")


def build_ensemble(config: ModelFields, obs_dim: int, act_dim: int, device: torch.device) -> tuple[GaussianEnsemble, torch.optim.Optimizer]:
    """The ensemble of ``config.members`` (``config.elites`` elites) MLPs of ``config.model_hidden``,
    and its Adam (``config.model_lr``; the weight decay is in the fit's loss)."""
    model = GaussianEnsemble(obs_dim, act_dim, config.members, config.model_hidden, config.elites).to(device)
    return model, torch.optim.Adam(model.parameters(), config.model_lr)


def fit_on(
    model: GaussianEnsemble,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: ModelFields,
    generator: torch.Generator,
    *,
    known_reward: bool,
    max_updates: int | None = None,
) -> FitReport:
    """Fit ``model`` on all transitions of ``batch`` with ``config``'s model_batch_size,
    model_max_epochs, model_patience and holdout_fraction (and at most ``max_updates``),
    scored on the outputs that planning and rollouts read (Δobs only with a ``known_reward``)."""
    x, y = transitions_to_xy(batch.obs, batch.actions, batch.rewards, batch.next_obs)
    scored = slice(0, model.obs_dim) if known_reward else slice(None)
    return fit_ensemble(
        model,
        x,
        y,
        optimizer,
        holdout_fraction=config.holdout_fraction,
        batch_size=config.model_batch_size,
        max_epochs=config.model_max_epochs,
        patience=config.model_patience,
        max_updates=max_updates,
        scored_outputs=scored,
        generator=generator,
    )


def fits_metrics(fits: list[FitReport]) -> dict[str, Any]:
    """What a run's metrics record about its model fits: how many, their total wall time and
    the last fit's holdout MSE (per output, and the mean)."""
    last = {"model_holdout_mse": fits[-1].holdout_mse, "model_holdout_loss": fits[-1].holdout_loss} if fits else {}
    return {"model_fits": len(fits), "model_fit_seconds": round(sum(f.seconds for f in fits), 3), **last}


def buffer_contents(buffer: ReplayBuffer) -> Batch:
    """Every transition held in ``buffer`` (views, no copy)."""
    n = len(buffer)
    return Batch(buffer.obs[:n], buffer.actions[:n], buffer.rewards[:n], buffer.next_obs[:n], buffer.terminated[:n])


def dataset_batch(data: OfflineData) -> Batch:
    """Every transition of an opened dataset as one batch on its device (actions in [-1, 1]);
    a dataset sampled from its memory maps has each column read whole."""
    arrays = data.arrays

    def column(name: str) -> np.ndarray:
        return np.asarray(arrays.column(name) if isinstance(arrays, MappedTransitions) else getattr(arrays, name))

    as_t = lambda x: torch.as_tensor(np.asarray(x, np.float32), device=data.device)  # noqa: E731
    actions = ActionScaler(data.action_space).from_env(column("action"))
    return Batch(as_t(column("obs")), as_t(actions), as_t(column("reward")), as_t(column("next_obs")), as_t(column("terminated")))


def load_dynamics(
    run_dir: str | Path, env_id: str, obs_dim: int, act_dim: int, device: torch.device
) -> tuple[GaussianEnsemble, dict[str, Any]]:
    """The ensemble saved in ``run_dir`` (a ``dynamics`` or ``pets`` run) and its metrics
    record; it must have been trained in ``env_id`` with these sizes."""
    ckpt = load_checkpoint(run_dir, device)
    policy = ckpt.meta.get("policy", {})
    if policy.get("kind") != GaussianEnsemble.kind:
        raise RlpipeError(f"{run_dir} holds no dynamics model (its checkpoint is a {ckpt.meta.get('algo')!r} run)")
    if ckpt.meta.get("env_id") != env_id:
        raise RlpipeError(f"the dynamics model in {run_dir} was trained for {ckpt.meta.get('env_id')}, not {env_id}")
    spec = policy["spec"]
    if (spec["obs_dim"], spec["act_dim"]) != (obs_dim, act_dim):
        raise RlpipeError(
            f"the dynamics model in {run_dir} has obs/action sizes {spec['obs_dim']}/{spec['act_dim']}, not {obs_dim}/{act_dim}"
        )
    model = GaussianEnsemble(**spec).to(device)
    model.load_state_dict(ckpt.state_dict(DYNAMICS_MODULE))
    return model, ckpt.meta


@torch.no_grad()
def branched_rollout(
    env: ModelEnv,
    policy: Callable[[torch.Tensor], torch.Tensor],
    start: torch.Tensor,
    length: int,
    into: ReplayBuffer,
    penalty: float = 0.0,
) -> int:
    """Roll ``policy`` out in the model for ``length`` steps from the states ``start`` [N, o]
    and add every model transition to ``into``, with reward ``r - penalty * uncertainty``
    (MOPO; 0 for MBPO). Terminated rollouts stop. Returns the transitions added."""
    obs, added = start, 0
    for _ in range(length):
        actions = policy(obs)
        next_obs, reward, terminated, uncertainty = env.branch(obs, actions)
        keep = torch.isfinite(next_obs).all(1) & torch.isfinite(reward)
        reward = reward - penalty * uncertainty
        into.add(*(t[keep].cpu().numpy() for t in (obs, actions, reward, next_obs, terminated.float())))
        added += int(keep.sum())
        obs = next_obs[keep & ~terminated]
        if len(obs) == 0:
            break
    return added


@dataclass
class MixedBatches:
    """Minibatches of ``real_ratio`` real transitions and the rest from ``model`` (all real
    while the model buffer is empty)."""

    real: Sampler
    model: ReplayBuffer
    real_ratio: float

    def sample(self, batch_size: int) -> Batch:
        if len(self.model) == 0:
            return self.real(batch_size)
        n_real = int(round(batch_size * self.real_ratio))
        parts = [
            b
            for b in (self.real(n_real) if n_real else None, self.model.sample(batch_size - n_real) if n_real < batch_size else None)
            if b is not None
        ]
        return parts[0] if len(parts) == 1 else join_batches(parts)
