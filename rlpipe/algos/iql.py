"""IQL (Kostrikov, Nair & Levine, 2021): Implicit Q-Learning, never querying unseen actions.

Read top to bottom: config and tuned defaults, the expectile loss, then ``train``: V(s)
regressed to an upper expectile of the target twin critics' min Q(s, a) over dataset
actions, fused twin Q(s, a) trained towards r + gamma V(s'), and the actor extracted by
advantage-weighted regression (weights exp(beta (Q - V)), clipped), in the shared
offline loop. With ``scale_rewards`` the rewards are scaled so the dataset's episode
returns span 1000, as the paper does on the MuJoCo datasets (a fixed scale, so ``beta``
means the same across them). Observations are normalised with the dataset's mean and std by a
normaliser the policy holds (so the saved policy applies it) and the critics share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import (
    DeterministicActor,
    EnsembleQ,
    NormalActor,
    TanhGaussianActor,
    ValueNet,
)
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import FinetuneFields, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.losses import squared_td_errors
from rlpipe.training.offline import Learner, fit_obs_normalizer, load_offline, returns_range_scale, train_offline
from rlpipe.training.optim import CosineLR, adam, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["iql"]


@dataclass
class Config(FinetuneFields, OfflineConfig):
    updates: int = positive(100_000)
    eval_every: int = positive(5_000)
    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005  # target critics' Polyak rate
    actor_lr: float = positive(3e-4)
    critic_lr: float = positive(3e-4)
    value_lr: float = positive(3e-4)
    hidden: tuple[int, ...] = layer_sizes((256, 256))
    expectile: float = 0.7  # 0.5 = mean (SARSA-like); towards 1 = max over dataset actions
    beta: float = 3.0  # inverse temperature of the advantage weights
    max_weight: float = 100.0  # clip of exp(beta * advantage)
    # gaussian: a tanh-squashed Gaussian (SAC's); normal: CORL's and d3rlpy's Gaussian on a tanh
    # mean with a state-independent std, whose likelihood of a dataset action at the bound stays
    # finite; deterministic: MSE
    actor: Literal["gaussian", "normal", "deterministic"] = "gaussian"
    normalize_obs: bool = True  # with the dataset's mean and std
    # cosine: the actor's rate annealed to 0 over the run's updates (with fine-tuning, its steps'
    # updates too), as CORL and d3rlpy run the paper's IQL
    actor_lr_schedule: Literal["constant", "cosine"] = "constant"
    scale_rewards: bool = False  # rewards x 1000 / (max - min episode return): the paper's MuJoCo setting

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.expectile < 1.0:
            raise RlpipeError(f"setting expectile={self.expectile!r}: expected a number in (0, 1)")


TUNED: dict[str, dict[str, Any]] = {
    # gamma 0.99 fails here: the upper expectile's optimism compounds over the horizon,
    # V rates fast-spinning states at half their true cost, and AWR learns to spin (about -700).
    "Pendulum-v1": dict(updates=20_000, hidden=(64, 64), gamma=0.9, eval_every=2_000),
}


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Mean of ``|expectile - 1(diff < 0)| * diff^2`` for ``diff = Q - V``.

    Minimised over V, this makes V the ``expectile`` of Q: positive errors (Q above V)
    weigh ``expectile``, negative ones ``1 - expectile``.
    """
    weight = torch.where(diff > 0, expectile, 1.0 - expectile)
    return (weight * diff.square()).mean()


@torch.no_grad()
def q_target(value: ValueNet, b: Batch, gamma: float, reward_scale: float = 1.0) -> torch.Tensor:
    """IQL's Q target c * r + gamma * (1 - terminated) * V(s'): no next action needed."""
    return reward_scale * b.rewards + gamma * (1.0 - b.terminated) * value(b.next_obs)


def awr_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """Advantage-weighted regression's weights exp(beta * A), clipped at ``max_weight``
    (one state with a large advantage must not dominate the batch)."""
    return torch.exp(beta * advantage).clamp(max=max_weight)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train IQL on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    obs_dim, act_dim, device = data.obs_dim, data.act_dim, data.device
    actor_classes: dict[str, type[TanhGaussianActor | NormalActor | DeterministicActor]] = {
        "gaussian": TanhGaussianActor,
        "normal": NormalActor,
        "deterministic": DeterministicActor,
    }
    actor = actor_classes[config.actor](obs_dim, act_dim, config.hidden, normalize_obs=config.normalize_obs).to(device)
    fit_obs_normalizer(actor, data)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=2, obs_norm=actor.obs_norm).to(device)
    value = ValueNet(obs_dim, config.hidden, activation="relu", obs_norm=actor.obs_norm).to(device)
    critic_target = target_copy(critic)
    actor_opt = adam(actor.parameters(), config.actor_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)
    value_opt = adam(value.parameters(), config.value_lr)
    actor_schedule = CosineLR(actor_opt, config.updates + config.finetune_env_steps) if config.actor_lr_schedule == "cosine" else None
    reward_scale = returns_range_scale(data) if config.scale_rewards else 1.0

    def update(b: Batch, _: int) -> Diagnosed:
        # V: an upper expectile of Q over the dataset's actions (no out-of-dataset action).
        with torch.no_grad():
            q = critic_target(b.obs, b.actions).min(0).values
        advantage = q - value(b.obs)
        value_loss = expectile_loss(advantage, config.expectile)
        optimizer_step(value_opt, value_loss)

        # Q: towards r + gamma V(s'), so the target needs no next action either.
        target = q_target(value, b, config.gamma, reward_scale)
        critic_loss = (critic(b.obs, b.actions) - target).square().mean(1).sum()
        optimizer_step(critic_opt, critic_loss)
        polyak_update(critic_target, critic, config.tau)

        # Actor: advantage-weighted regression onto the dataset's actions.
        weight = awr_weights(advantage.detach(), config.beta, config.max_weight)
        if config.actor != "deterministic":
            nll = -cast(TanhGaussianActor | NormalActor, actor).log_prob(b.obs, b.actions)
        else:
            nll = (actor(b.obs) - b.actions).square().sum(-1)
        actor_loss = (weight * nll).mean()
        optimizer_step(actor_opt, actor_loss)
        if actor_schedule is not None:
            actor_schedule.step()
        return {
            "value_loss": value_loss.detach(),
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "q_mean": q.mean(),
            "advantage_mean": advantage.detach().mean(),
        }

    def td_errors(b: Batch) -> torch.Tensor:
        return squared_td_errors(critic(b.obs, b.actions), q_target(value, b, config.gamma, reward_scale))

    modules: dict[str, nn.Module] = {"policy": actor, "critic": critic, "critic_target": critic_target, "value": value}
    return train_offline(SPEC.name, config, data, Learner(modules, update, td_errors=td_errors), out_dir, progress)
