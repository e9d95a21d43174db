"""TD3: clipped double Q (fused twin critics), delayed actor updates, target policy smoothing.

Read top to bottom: config and tuned defaults, ``td3_update`` (critic every step; actor
and targets every ``policy_delay`` steps; TD3+BC and ReBRAC reuse it offline with their own
actor loss, ReBRAC also with a penalty in the target), ``make_agent``: networks and
Gaussian (or Ornstein-Uhlenbeck) exploration noise (TD3+HER reuses it), then ``train``: the
shared off-policy loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch
from torch import nn

from rlpipe.algos import ddpg
from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.networks import DeterministicActor, EnsembleQ
from rlpipe.training import Batch, StepSink, TrainResult, Update
from rlpipe.training.config import positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.losses import TDErrors, squared_td_errors
from rlpipe.training.noise import make_noise
from rlpipe.training.offpolicy import Agent, OffPolicySetup, noisy_explore, setup, train_off_policy
from rlpipe.training.optim import adam, frozen, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["td3"]


@dataclass
class Config(ddpg.Config):
    """DDPG's settings (networks, rates, exploration noise) plus TD3's three changes."""

    policy_delay: int = positive(2)
    target_noise: float = 0.2  # target policy smoothing
    target_noise_clip: float = 0.5


TUNED = ddpg.TUNED  # DDPG's tuned values serve TD3 as well


ActorLoss = Callable[[Batch, torch.Tensor, torch.Tensor], torch.Tensor]
"""``actor_loss(batch, pi, q) -> loss`` from the actor's actions ``pi = actor(batch.obs)``
and the first critic's values ``q = Q1(batch.obs, pi)`` (or the twins' minimum)."""

TargetPenalty = Callable[[Batch, torch.Tensor], torch.Tensor]
"""``penalty(batch, next_action) -> [B]``, subtracted from the target critics' value of
``(batch.next_obs, next_action)`` before discounting."""


class TD3Settings(Protocol):
    """What TD3's update reads of a config (TD3's, TD3+BC's, ReBRAC's)."""

    gamma: float
    tau: float
    actor_lr: float
    critic_lr: float
    policy_delay: int
    target_noise: float
    target_noise_clip: float


def maximise_q(b: Batch, pi: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TD3's actor loss: -Q1(s, pi(s))."""
    return -q.mean()


@torch.no_grad()
def smoothed_next_action(actor_target: nn.Module, next_obs: torch.Tensor, noise_std: float, noise_clip: float) -> torch.Tensor:
    """Target policy smoothing: mu'(s') plus Gaussian noise clipped to +-noise_clip, the sum
    clipped to the action range [-1, 1]."""
    action = actor_target(next_obs)
    noise = (torch.randn_like(action) * noise_std).clamp(-noise_clip, noise_clip)
    return (action + noise).clamp(-1.0, 1.0)


@torch.no_grad()
def td3_target(
    actor_target: nn.Module, critic_target: EnsembleQ, b: Batch, config: TD3Settings, penalty: TargetPenalty | None = None
) -> torch.Tensor:
    """Clipped double-Q target r + gamma * (1 - terminated) * (min_i Q'_i(s', a') - penalty(b, a')),
    a' the smoothed target action (no penalty: TD3's)."""
    next_action = smoothed_next_action(actor_target, b.next_obs, config.target_noise, config.target_noise_clip)
    next_q = critic_target(b.next_obs, next_action).min(0).values
    if penalty is not None:
        next_q = next_q - penalty(b, next_action)
    return b.rewards + config.gamma * (1.0 - b.terminated) * next_q


def td3_update(
    actor: DeterministicActor,
    critic: EnsembleQ,
    config: TD3Settings,
    actor_loss: ActorLoss = maximise_q,
    target_penalty: TargetPenalty | None = None,
    actor_q_min: bool = False,
) -> tuple[Update, dict[str, nn.Module]]:
    """TD3's update of ``actor`` and twin ``critic`` (TD3+BC reuses it with its own ``actor_loss``,
    ReBRAC also with a ``target_penalty`` and the actor's Q the twins' minimum, ``actor_q_min``).

    Makes the target networks and optimisers. Returns
    ``update(batch, update_index)`` (critic every call; actor and targets every
    ``policy_delay`` calls) and the modules to checkpoint.
    """
    actor_target, critic_target = target_copy(actor), target_copy(critic)
    actor_opt = adam(actor.parameters(), config.actor_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)
    critic_params = list(critic.parameters())

    def update(b: Batch, i: int) -> Diagnosed:
        target = td3_target(actor_target, critic_target, b, config, target_penalty)
        q_data = critic(b.obs, b.actions)
        critic_loss = (q_data - target).square().mean(1).sum()
        optimizer_step(critic_opt, critic_loss)
        diagnostics = {"critic_loss": critic_loss.detach(), "q_mean": q_data.detach().mean(), "q_min": q_data.detach().min()}
        if i % config.policy_delay:
            return diagnostics

        # Delayed actor: improve on Q1 or the twins' minimum (critic weights frozen), then move the targets.
        with frozen(critic_params):
            pi = actor(b.obs)
            q = critic(b.obs, pi)
            loss = actor_loss(b, pi, q.min(0).values if actor_q_min else q[0])
            optimizer_step(actor_opt, loss)
        polyak_update(critic_target, critic, config.tau)
        polyak_update(actor_target, actor, config.tau)
        return {**diagnostics, "actor_loss": loss.detach(), "bc_mse": (pi.detach() - b.actions).square().mean()}

    return update, {"policy": actor, "critic": critic, "policy_target": actor_target, "critic_target": critic_target}


def td3_td_errors(modules: dict[str, nn.Module], config: TD3Settings, penalty: TargetPenalty | None = None) -> TDErrors:
    """The squared TD errors of `td3_update`'s twin critics (``modules``) against its target."""
    critic, actor_target = modules["critic"], modules["policy_target"]
    critic_target = cast(EnsembleQ, modules["critic_target"])  # a copy of the critic, an EnsembleQ
    return lambda b: squared_td_errors(critic(b.obs, b.actions), td3_target(actor_target, critic_target, b, config, penalty))


def make_agent(config: Config, env: OffPolicySetup) -> Agent:
    """TD3's networks, update and noisy exploration for ``env``'s sizes and device."""
    obs_dim, act_dim, device = env.obs_dim, env.act_dim, env.device
    actor = DeterministicActor(obs_dim, act_dim, config.hidden).to(device)
    critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=2).to(device)
    update, modules = td3_update(actor, critic, config)
    noise = make_noise(config.noise, (config.num_envs, act_dim), config.noise_sigma, env.rng, theta=config.ou_theta, dt=config.ou_dt)
    return Agent(actor, modules, noisy_explore(actor, noise, device), update)


def train(
    config: Config,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    step_sink: StepSink | None = None,
) -> TrainResult:
    """Train TD3; with ``out_dir`` also write checkpoint, ``metrics.json`` and DVCLive curve.

    ``step_sink`` is called after every vector-env step, as in :func:`rlpipe.algos.sac.train`.
    """
    env = setup(SPEC.name, config)
    return train_off_policy(SPEC.name, config, env, make_agent(config, env), out_dir, progress, step_sink)
