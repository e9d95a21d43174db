"""SAC: tanh-Gaussian actor, fused twin critics, automatic entropy tuning.

Read top to bottom: config and tuned defaults, ``make_agent``: networks, the update
(critic -> actor -> temperature -> target critics) and exploration, then ``train``: the
shared off-policy loop that collects transitions (optionally streaming every one of them
to ``step_sink``). SAC+HER (``her.py``) reuses ``make_agent``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlpipe.models.networks import EnsembleQ, TanhGaussianActor
from rlpipe.training import Batch, StepSink, TrainResult, config_for_env
from rlpipe.training.env import BOX
from rlpipe.training.offpolicy import Agent, OffPolicySetup, setup, train_off_policy
from rlpipe.training.optim import adam, frozen, polyak_update, target_copy

ACTION_SPACES = (BOX,)


@dataclass
class Config:
    env_id: str = "Pendulum-v1"
    env_steps: int = 10_000
    seed: int = 0
    num_envs: int = 1
    buffer_size: int = 1_000_000
    batch_size: int = 256
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -action_dim
    hidden: tuple[int, ...] = (256, 256)
    learning_starts: int = 5_000  # uniform random actions before this many env steps
    updates_per_step: float = 1.0  # gradient updates per collected transition
    eval_every: int = 1_000
    eval_episodes: int = 10
    stop_at_return: float | None = None
    device: str = "cpu"
    torch_threads: int = 1


TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(
        # Small nets and batches learn Pendulum as well as 256x256 and update ~3x faster.
        env_steps=10_000, buffer_size=100_000, batch_size=128, actor_lr=1e-3, critic_lr=1e-3,
        alpha_lr=1e-3, hidden=(64, 64), learning_starts=1_000,
    ),
}


def make_config(env_id: str, **overrides: Any) -> Config:
    """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
    return config_for_env(Config, TUNED, env_id, **overrides)


def actor_and_temperature_step(
    obs: torch.Tensor,
    actor: TanhGaussianActor,
    critic: EnsembleQ,
    log_alpha: torch.Tensor,
    target_entropy: float,
    actor_opt: torch.optim.Optimizer,
    alpha_opt: torch.optim.Optimizer,
) -> None:
    """SAC's policy improvement on ``obs`` (CQL reuses it): the actor maximises
    min Q - alpha * log pi, then the temperature moves the entropy towards the target."""
    alpha = log_alpha.detach().exp()
    with frozen(list(critic.parameters())):  # no wasted gradients for the critic
        action, logp = actor.sample(obs)
        actor_loss = (alpha * logp - critic(obs, action).min(0).values).mean()
        actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        actor_opt.step()
    alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
    alpha_opt.zero_grad(set_to_none=True)
    alpha_loss.backward()
    alpha_opt.step()


def make_agent(config: Config, env: OffPolicySetup) -> Agent:
    """SAC's networks, update and sampling exploration for ``env``'s sizes and device."""
    obs_dim, act_dim, device = env.obs_dim, env.act_dim, env.device

    actor = TanhGaussianActor(obs_dim, act_dim, config.hidden).to(device)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=2).to(device)
    critic_target = target_copy(critic)
    log_alpha = torch.tensor(np.log(config.init_alpha), dtype=torch.float32, device=device, requires_grad=True)
    target_entropy = -float(act_dim) if config.target_entropy is None else config.target_entropy
    actor_opt = adam(actor.parameters(), config.actor_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)
    alpha_opt = adam([log_alpha], config.alpha_lr)

    def update(b: Batch, _: int) -> None:
        alpha = log_alpha.detach().exp()
        # Critic: soft Bellman target from the min of the twin target critics.
        with torch.no_grad():
            next_action, next_logp = actor.sample(b.next_obs)
            next_q = critic_target(b.next_obs, next_action).min(0).values - alpha * next_logp
            target = b.rewards + config.gamma * (1.0 - b.terminated) * next_q
        critic_loss = 0.5 * (critic(b.obs, b.actions) - target).square().mean(1).sum()
        critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        critic_opt.step()

        actor_and_temperature_step(b.obs, actor, critic, log_alpha, target_entropy, actor_opt, alpha_opt)
        polyak_update(critic_target, critic, config.tau)

    def explore(obs: np.ndarray, _: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor.sample(torch.as_tensor(obs, dtype=torch.float32, device=device))[0].cpu().numpy()

    modules = {"policy": actor, "critic": critic, "critic_target": critic_target}
    return Agent(actor, modules, explore, update, lambda: {"alpha": float(log_alpha.detach().exp())})


def train(
    config: Config,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    step_sink: StepSink | None = None,
) -> TrainResult:
    """Train SAC; with ``out_dir`` also write checkpoint, ``metrics.json`` and DVCLive curve.

    ``step_sink(obs, env_actions, rewards, next_obs, terminated, truncated, valid)`` is
    called after every vector-env step (numpy arrays, batch = ``num_envs``). ``next_obs``
    is the real next observation even at episode ends; rows with ``valid`` False are
    autoreset steps and are not transitions.
    """
    env = setup("sac", config)
    return train_off_policy("sac", config, env, make_agent(config, env), out_dir, progress, step_sink)
