"""GAIL: generative adversarial imitation learning, with our PPO as the generator.

A discriminator D(s, a) -> probability that the pair comes from the generator (the policy)
rather than from the expert dataset is trained with binary cross-entropy on each PPO rollout
against as many expert pairs. The policy is trained by PPO on the reward
r(s, a) = -log D(s, a): large for expert-like pairs, near 0 for pairs D recognises as the
policy's. The env reward is never used; the env only supplies states and episode ends.

Episode ends: PPO treats the env's ``terminated`` as it does for env rewards (no bootstrap),
with no absorbing state. Since -log D > 0, ending an episode forfeits future reward, so the
generator is pushed to survive: on CartPole, where episodes end only on failure, this bias
agrees with the expert (the GAIL paper and the reference text work the same way). Where
reaching a terminal state is the goal, an absorbing-state treatment (Kostrikov et al.,
"Discriminator-Actor-Critic", 2019) would be needed; it is not implemented. Measured on
CartPole from 30 expert pairs: a constant reward in place of -log D learns about as fast
(10 seeds), and the reward log(1 - D) - log D, which is negative once D spots the policy,
stays below 60 after 50k steps (3 seeds); so there the survival bias does much of the work,
as it does in the reference text.

Read top to bottom: config (PPO's fields plus the dataset and discriminator settings), the
discriminator and its reward, then ``train``: PPO's loop with a per-rollout ``reward_fn``
that first updates D on the rollout, then returns the rewards of the updated D.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.algos import ppo
from rlpipe.algos.registry import REGISTRY
from rlpipe.envs import base_env_id
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import mlp
from rlpipe.training import Batch, DatasetFields, TrainResult
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.env import BOX, DISCRETE
from rlpipe.training.offline import dataset_metrics, load_offline
from rlpipe.training.optim import adam, optimizer_step

ACTION_SPACES = (DISCRETE, BOX)
SPEC = REGISTRY["gail"]


@dataclass
class Config(DatasetFields, ppo.Config):
    """PPO's settings (the generator: env_steps, num_envs, learning_rate, ...), the expert
    dataset (``env_id`` is filled from its metadata; ``max_samples``: the reference text
    imitates 30 pairs of one episode) and the discriminator's settings."""

    disc_learning_rate: float = positive(1e-3)
    disc_hidden: tuple[int, ...] = layer_sizes((128,))
    disc_updates: int = positive(1)  # discriminator updates per PPO rollout


TUNED: dict[str, dict[str, Any]] = {
    **ppo.TUNED,  # the generator starts from PPO's tuned settings
    # From 30 expert pairs: 475 after 4-17k env steps (55-132 episodes, 10 seeds); ends at 500.
    "CartPole-v1": dict(ppo.TUNED["CartPole-v1"], env_steps=50_000, eval_every=2_048),
}


class Discriminator(nn.Module):
    """D(s, a) as a logit: sigmoid(logit) is the probability that (s, a) is the generator's."""

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool, hidden: tuple[int, ...] = (128,)) -> None:
        super().__init__()
        self.act_dim, self.discrete = act_dim, discrete
        self.net = mlp(obs_dim + act_dim, 1, hidden, "relu")

    def encode(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """D's input: observations with one-hot discrete actions, or continuous actions
        clipped to the [-1, 1] the env receives (PPO's Gaussian samples are unbounded)."""
        a = F.one_hot(actions.long(), self.act_dim).float() if self.discrete else actions.clamp(-1.0, 1.0)
        return torch.cat([obs, a], dim=-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.net(self.encode(obs, actions)).squeeze(-1)


def imitation_reward(logits: torch.Tensor) -> torch.Tensor:
    """-log D(s, a) = softplus(-logit): positive, larger the more expert-like D finds the pair."""
    return F.softplus(-logits)


def discriminator_update(
    disc: Discriminator,
    optimizer: torch.optim.Optimizer,
    policy_obs: torch.Tensor,
    policy_actions: torch.Tensor,
    expert: Batch,
    grad_penalty: float = 0.0,
) -> float:
    """One binary cross-entropy step: label 1 for the policy's pairs, 0 for the expert's;
    plus ``grad_penalty`` * (|grad D| - 1)^2 on random mixes of the two (DAC uses 10)."""
    policy_x, expert_x = disc.encode(policy_obs, policy_actions), disc.encode(expert.obs, expert.actions)
    x = torch.cat([policy_x, expert_x])
    labels = torch.cat([torch.ones(len(policy_obs)), torch.zeros(len(expert.obs))]).to(x.device)
    loss = F.binary_cross_entropy_with_logits(disc.net(x).squeeze(-1), labels)
    if grad_penalty > 0:
        mix = torch.rand(len(policy_x), 1, device=x.device)
        mixed = (mix * policy_x + (1 - mix) * expert_x).requires_grad_(True)
        (grad,) = torch.autograd.grad(disc.net(mixed).sum(), mixed, create_graph=True)
        loss = loss + grad_penalty * (grad.norm(dim=-1) - 1).square().mean()
    optimizer_step(optimizer, loss)
    return loss.item()


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train GAIL on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    if data.info.env_id != base_env_id(config.env_id):
        raise RlpipeError(f"dataset {data.info.name!r} was collected in {data.info.env_id!r}, not {config.env_id!r}")
    disc = Discriminator(data.obs_dim, data.act_dim, data.discrete, config.disc_hidden).to(data.device)
    optimizer = adam(disc.parameters(), config.disc_learning_rate)
    disc_updates, disc_loss = 0, None

    def reward_fn(obs: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        nonlocal disc_updates, disc_loss
        policy_obs, policy_actions = obs[valid], actions[valid]  # reset steps are not pairs
        for _ in range(config.disc_updates):
            expert = data.sampler.sample(len(policy_obs))  # balanced classes
            disc_loss = discriminator_update(disc, optimizer, policy_obs, policy_actions, expert)
            disc_updates += 1
        with torch.no_grad():
            return imitation_reward(disc(obs, actions))

    def extra_metrics() -> dict[str, Any]:
        return {**dataset_metrics(data), "discriminator_updates": disc_updates, "discriminator_loss": disc_loss}

    return ppo.train(
        config,
        out_dir,
        progress=progress,
        reward_fn=reward_fn,
        algo=SPEC.name,
        extra_metrics=extra_metrics,
        extra_modules={"discriminator": disc},
    )
