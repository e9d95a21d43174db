"""ReBRAC (Tarasov et al., 2023): TD3+BC with a behaviour penalty in the critic's target too.

Read top to bottom: config and tuned defaults, the actor loss
``mean(beta_1 * ||pi(s) - a||^2 - lambda * min_i Q_i(s, pi(s)))``, ``lambda = 1 / mean|Q|``,
the target penalty ``beta_2 * ||a'_pi - a'||^2`` (the smoothed target action against the
dataset's next action, subtracted from the next state's value), then ``train``: LayerNorm
critics, the dataset's next actions in every batch (``load_offline(next_actions=True)``),
TD3's own update (:func:`rlpipe.algos.td3.td3_update`) with this loss and penalty, and the
shared offline loop. The defaults are CORL's ``algorithms/offline/rebrac.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos.registry import REGISTRY
from rlpipe.algos.td3 import td3_td_errors, td3_update
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import DeterministicActor, EnsembleQ, edac_init_
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.env import BOX
from rlpipe.training.offline import Learner, fit_obs_normalizer, load_offline, train_offline

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["rebrac"]


@dataclass
class Config(OfflineConfig):
    updates: int = positive(100_000)  # CORL: 1M
    eval_every: int = positive(5_000)
    batch_size: int = positive(1024)
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = positive(1e-3)
    critic_lr: float = positive(1e-3)
    hidden: tuple[int, ...] = layer_sizes((256, 256, 256))
    actor_bc_coef: float = 1.0  # beta_1: the behaviour penalty's weight in the actor loss (tuned per dataset)
    critic_bc_coef: float = 1.0  # beta_2: its weight in the critic's target (tuned per dataset)
    normalize_q: bool = True  # divide the actor's Q term by the batch's mean |Q|
    actor_layer_norm: bool = False  # LayerNorm after each hidden layer's activation
    critic_layer_norm: bool = True
    edac_init: bool = False  # CORL's: hidden biases 0.1, last layers uniform in +-1e-3 (actor) / +-3e-3 (critics)
    normalize_obs: bool = False  # with the dataset's mean and std (CORL's ReBRAC: off)
    policy_delay: int = positive(2)
    target_noise: float = 0.2  # target policy smoothing, in units of the [-1, 1] action range
    target_noise_clip: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("actor_bc_coef", "critic_bc_coef"):
            if getattr(self, name) < 0:
                raise RlpipeError(f"setting {name}={getattr(self, name)!r}: expected a number >= 0")


TUNED: dict[str, dict[str, Any]] = {
    # Small nets and batch 256 as TD3+BC's (64x64 at batch 1024 scores the same at twice the
    # CPU). Penalties 0.1: 0.01 scores as well on pendulum-mixed but collapses on the narrow
    # pendulum-expert-sampled, where 0.1 holds (docs/algorithms/offline.md).
    "Pendulum-v1": dict(updates=10_000, eval_every=1_000, hidden=(64, 64), batch_size=256, actor_bc_coef=0.1, critic_bc_coef=0.1),
}


def behaviour_penalty(actions: torch.Tensor, dataset_actions: torch.Tensor, coef: float) -> torch.Tensor:
    """``coef * ||actions - dataset_actions||^2`` per row, summed over action dimensions ([B])."""
    return coef * (actions - dataset_actions).square().sum(-1)


def rebrac_actor_loss(pi: torch.Tensor, q: torch.Tensor, actions: torch.Tensor, bc_coef: float, normalize_q: bool) -> torch.Tensor:
    """``mean(bc_coef * ||pi(s) - a||^2 - lambda * Q(s, pi(s)))``, ``lambda = 1 / mean|Q|``
    (not differentiated) with ``normalize_q``, else 1."""
    lam = 1.0 / q.abs().mean().detach() if normalize_q else 1.0
    return (behaviour_penalty(pi, actions, bc_coef) - lam * q).mean()


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train ReBRAC on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES, next_actions=True)
    obs_dim, act_dim, device = data.obs_dim, data.act_dim, data.device
    actor = DeterministicActor(obs_dim, act_dim, config.hidden, config.normalize_obs, config.actor_layer_norm).to(device)
    fit_obs_normalizer(actor, data)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=2, obs_norm=actor.obs_norm, layer_norm=config.critic_layer_norm).to(device)
    if config.edac_init:
        edac_init_(actor, 1e-3)
        edac_init_(critic, 3e-3)

    def actor_loss(b: Batch, pi: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return rebrac_actor_loss(pi, q, b.actions, config.actor_bc_coef, config.normalize_q)

    def target_penalty(b: Batch, next_action: torch.Tensor) -> torch.Tensor:
        assert b.next_actions is not None  # the sampler was asked for them
        return behaviour_penalty(next_action, b.next_actions, config.critic_bc_coef)

    update, modules = td3_update(actor, critic, config, actor_loss, target_penalty, actor_q_min=True)
    td_errors = td3_td_errors(modules, config, target_penalty)
    learner = Learner(modules, update, update_period=config.policy_delay, td_errors=td_errors)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
