"""AWAC (Nair et al., 2020): Advantage-Weighted Actor-Critic, offline and then online.

Read top to bottom: config and tuned defaults, the actor's weights, then ``train``: fused
twin Q(s, a) trained towards r + gamma (1 - terminated) min Q'(s', a'), a' sampled from
the current actor (no entropy term), and the actor fitted by weighted likelihood of the
dataset's actions, each weighted by exp((min Q(s, a) - min Q(s, a_pi)) / awac_lambda),
clipped at ``exp_adv_max``, with a_pi sampled from the actor (a one-sample estimate of
V(s)). Each update steps the critics, then the actor, then the target critics, in the
shared offline loop; ``--finetune-env-steps`` continues the same update online.
Observations are normalised with the dataset's mean and std by a normaliser the policy
holds (so the saved policy applies it) and the critics share.

The defaults are CORL's ``algorithms/offline/awac.py``, but for two departures: a
tanh-Gaussian actor with a state-dependent std (CORL: an unsquashed Gaussian mean with
one learnt std per action dimension, sampled actions clipped to the range; ``actor=normal``
is that actor with a tanh on the mean, `NormalActor` in rlpipe.nets.networks), and 256x256 hidden layers
(CORL: three layers of 256).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from rlpipe.algos.iql import awr_weights
from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.networks import EnsembleQ, NormalActor, TanhGaussianActor
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import FinetuneFields, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.losses import squared_td_errors
from rlpipe.training.offline import Learner, fit_obs_normalizer, load_offline, train_offline
from rlpipe.training.optim import adam, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["awac"]


@dataclass
class Config(FinetuneFields, OfflineConfig):
    updates: int = positive(100_000)  # CORL: 1M
    eval_every: int = positive(5_000)
    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005  # target critics' Polyak rate
    actor_lr: float = positive(3e-4)
    critic_lr: float = positive(3e-4)
    hidden: tuple[int, ...] = layer_sizes((256, 256))
    awac_lambda: float = positive(1.0)  # temperature of the advantage weights; large: plain likelihood BC
    exp_adv_max: float = positive(100.0)  # clip of the weights
    normalize_obs: bool = True  # with the dataset's mean and std
    # gaussian: tanh-squashed (SAC's); normal: CORL's, whose likelihood of a saturated dataset
    # action stays finite (NormalActor)
    actor: Literal["gaussian", "normal"] = "gaussian"


TUNED: dict[str, dict[str, Any]] = {
    # At gamma 0.99 seed 0 reaches -343 by 2000 updates, then falls to about -800 and stays
    # there; at 0.9 (as IQL's) seeds 0-4 hold -158 to -239 from 4000 updates on (docs/algorithms/offline.md).
    "Pendulum-v1": dict(updates=6_000, eval_every=2_000, hidden=(64, 64), gamma=0.9),
}


@torch.no_grad()
def awac_weights(
    critic: EnsembleQ, actor: TanhGaussianActor | NormalActor, b: Batch, awac_lambda: float, exp_adv_max: float
) -> torch.Tensor:
    """The actor's weights per row, exp(A / awac_lambda) clipped at ``exp_adv_max``, for the
    advantage A = min Q(s, a) - min Q(s, a_pi) of the dataset's action over one action
    sampled from the actor."""
    pi_action, _ = actor.sample(b.obs)
    advantage = critic(b.obs, b.actions).min(0).values - critic(b.obs, pi_action).min(0).values
    return awr_weights(advantage, 1.0 / awac_lambda, exp_adv_max)


@torch.no_grad()
def q_target(critic_target: EnsembleQ, actor: TanhGaussianActor | NormalActor, b: Batch, gamma: float) -> torch.Tensor:
    """r + gamma (1 - terminated) min Q'(s', a'), a' sampled from the current actor."""
    next_action, _ = actor.sample(b.next_obs)
    return b.rewards + gamma * (1.0 - b.terminated) * critic_target(b.next_obs, next_action).min(0).values


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train AWAC on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    obs_dim, act_dim, device = data.obs_dim, data.act_dim, data.device
    actor_class = NormalActor if config.actor == "normal" else TanhGaussianActor
    actor = actor_class(obs_dim, act_dim, config.hidden, normalize_obs=config.normalize_obs).to(device)
    fit_obs_normalizer(actor, data)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=2, obs_norm=actor.obs_norm).to(device)
    critic_target = target_copy(critic)
    actor_opt = adam(actor.parameters(), config.actor_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)

    def update(b: Batch, _: int) -> Diagnosed:
        target = q_target(critic_target, actor, b, config.gamma)
        q_data = critic(b.obs, b.actions)
        critic_loss = (q_data - target).square().mean(1).sum()
        optimizer_step(critic_opt, critic_loss)

        weight = awac_weights(critic, actor, b, config.awac_lambda, config.exp_adv_max)
        actor_loss = -(weight * actor.log_prob(b.obs, b.actions)).mean()
        optimizer_step(actor_opt, actor_loss)
        polyak_update(critic_target, critic, config.tau)
        return {"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach(), "q_mean": q_data.detach().mean()}

    def td_errors(b: Batch) -> torch.Tensor:
        return squared_td_errors(critic(b.obs, b.actions), q_target(critic_target, actor, b, config.gamma))

    modules: dict[str, nn.Module] = {"policy": actor, "critic": critic, "critic_target": critic_target}
    return train_offline(SPEC.name, config, data, Learner(modules, update, td_errors=td_errors), out_dir, progress)
