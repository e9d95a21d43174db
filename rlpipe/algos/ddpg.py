"""DDPG: deterministic actor, one Q critic, target networks, Gaussian or OU exploration.

Read top to bottom: config and tuned defaults, ``make_agent``: networks, the update
(critic, then actor, then both targets, every step) and exploration, then ``train``: the
shared off-policy loop. TD3 (``td3.py``) is this algorithm plus twin critics, delayed
actor and target smoothing; DDPG+HER (``her.py``) reuses ``make_agent``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.networks import DeterministicActor, EnsembleQ
from rlpipe.training import Batch, OnlineConfig, StepSink, TrainResult
from rlpipe.training.config import buffer_capacity, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.noise import make_noise
from rlpipe.training.offpolicy import Agent, OffPolicySetup, noisy_explore, setup, train_off_policy
from rlpipe.training.optim import adam, frozen, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["ddpg"]


@dataclass
class Config(OnlineConfig):
    env_steps: int = positive(20_000)
    buffer_size: int = buffer_capacity(1_000_000)
    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = positive(3e-4)
    critic_lr: float = positive(3e-4)
    hidden: tuple[int, ...] = layer_sizes((256, 256))
    noise: Literal["gaussian", "ou"] = "gaussian"  # exploration noise; "ou": Ornstein-Uhlenbeck
    noise_sigma: float = 0.1  # in units of the [-1, 1] action range
    ou_theta: float = 0.15
    ou_dt: float = 1e-2
    learning_starts: int = 10_000  # uniform random actions before this many env steps
    updates_per_step: float = 1.0


TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(
        env_steps=20_000,
        buffer_size=100_000,
        batch_size=128,
        actor_lr=1e-3,
        critic_lr=1e-3,
        hidden=(64, 64),
        learning_starts=1_000,
    ),
}


@torch.no_grad()
def ddpg_target(actor_target: nn.Module, critic_target: EnsembleQ, b: Batch, gamma: float) -> torch.Tensor:
    """One-step TD target r + gamma * (1 - terminated) * Q'(s', mu'(s')) (truncated rows bootstrap)."""
    next_q = critic_target(b.next_obs, actor_target(b.next_obs))[0]
    return b.rewards + gamma * (1.0 - b.terminated) * next_q


def make_agent(config: Config, env: OffPolicySetup) -> Agent:
    """DDPG's networks, update and noisy exploration for ``env``'s sizes and device."""
    obs_dim, act_dim, device = env.obs_dim, env.act_dim, env.device

    actor = DeterministicActor(obs_dim, act_dim, config.hidden).to(device)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=1).to(device)
    actor_target, critic_target = target_copy(actor), target_copy(critic)
    actor_opt = adam(actor.parameters(), config.actor_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)
    critic_params = list(critic.parameters())

    def update(b: Batch, _: int) -> Diagnosed:
        target = ddpg_target(actor_target, critic_target, b, config.gamma)
        q_data = critic(b.obs, b.actions)[0]
        critic_loss = (q_data - target).square().mean()
        optimizer_step(critic_opt, critic_loss)

        # Actor: follow the critic's action gradient (critic weights frozen).
        with frozen(critic_params):
            actor_loss = -critic(b.obs, actor(b.obs))[0].mean()
            optimizer_step(actor_opt, actor_loss)
        polyak_update(critic_target, critic, config.tau)
        polyak_update(actor_target, actor, config.tau)
        return {"critic_loss": critic_loss.detach(), "actor_loss": actor_loss.detach(), "q_mean": q_data.detach().mean()}

    noise = make_noise(config.noise, (config.num_envs, act_dim), config.noise_sigma, env.rng, theta=config.ou_theta, dt=config.ou_dt)
    modules = {"policy": actor, "critic": critic, "policy_target": actor_target, "critic_target": critic_target}
    return Agent(actor, modules, noisy_explore(actor, noise, device), update)


def train(
    config: Config,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    step_sink: StepSink | None = None,
) -> TrainResult:
    """Train DDPG; with ``out_dir`` also write checkpoint, ``metrics.json`` and DVCLive curve.

    ``step_sink`` is called after every vector-env step, as in :func:`rlpipe.algos.sac.train`.
    """
    env = setup(SPEC.name, config)
    return train_off_policy(SPEC.name, config, env, make_agent(config, env), out_dir, progress, step_sink)
