"""SAC: tanh-Gaussian actor, fused twin critics, automatic entropy tuning.

Read top to bottom: config and tuned defaults, ``SoftActorCritic``: the networks and the
steps of an update (critic -> actor -> temperature -> target critics; CQL reuses it),
``make_agent``: SAC's update and exploration, then ``train``: the
shared off-policy loop that collects transitions (optionally streaming every one of them
to ``step_sink``). SAC+HER (``her.py``) reuses ``make_agent``.

``StackedSoftActorCritic`` and ``train_seeds`` train several seeds as one batched
computation (rlpipe.training.seedstack): the same per-seed losses on stacked weights, each
seed stepping its own envs and sampling its own replay buffer; CQL's batched seeds reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.networks import EnsembleQ, TanhGaussianActor
from rlpipe.training import Batch, OnlineConfig, StepSink, TrainResult, Update
from rlpipe.training.config import buffer_capacity, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.losses import squared_td_errors
from rlpipe.training.offpolicy import Agent, OffPolicySetup, setup, train_off_policy
from rlpipe.training.optim import adam, frozen, optimizer_step, polyak_update, target_copy
from rlpipe.training.seeding import seed_everything
from rlpipe.training.seedstack import SeedStack, train_off_policy_seeds

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["sac"]


@dataclass
class SACFields:
    """SAC's settings in a run's config (SAC, MBPO, MOPO): what :class:`SoftActorCritic`
    and its update read."""

    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = positive(3e-4)
    critic_lr: float = positive(3e-4)
    alpha_lr: float = positive(3e-4)
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -action_dim
    hidden: tuple[int, ...] = layer_sizes((256, 256))


class SACNetworkSettings(Protocol):
    """What :meth:`SoftActorCritic.build` reads of a config: :class:`SACFields`' networks and
    learning rates (CQL's config declares its own)."""

    hidden: tuple[int, ...]
    init_alpha: float
    target_entropy: float | None
    actor_lr: float
    critic_lr: float
    alpha_lr: float


class SeedStackSettings(SACNetworkSettings, Protocol):
    """What :meth:`StackedSoftActorCritic.build` reads of each seed's config: the networks'
    settings, the seed they are built after and the target networks' rate."""

    seed: int
    torch_threads: int
    tau: float


@dataclass
class Config(SACFields, OnlineConfig):
    buffer_size: int = buffer_capacity(1_000_000)
    learning_starts: int = 5_000  # uniform random actions before this many env steps
    updates_per_step: float = 1.0  # gradient updates per collected transition


TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(
        # Small nets and batches learn Pendulum as well as 256x256 and update ~3x faster.
        env_steps=10_000,
        buffer_size=100_000,
        batch_size=128,
        actor_lr=1e-3,
        critic_lr=1e-3,
        alpha_lr=1e-3,
        hidden=(64, 64),
        learning_starts=1_000,
    ),
}


class Temperature(nn.Module):
    """SAC's entropy temperature alpha, learnt as its log (a module, so batched seeds can
    stack it with the networks: rlpipe.training.seedstack)."""

    def __init__(self, init_alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(np.log(init_alpha), dtype=torch.float32))


@dataclass
class SoftActorCritic:
    """SAC's learnable parts and their three steps, shared with CQL: the tanh-Gaussian
    actor, fused twin critics and their target, the temperature, one Adam each.

    The losses (``soft_target``, ``actor_loss``, ``alpha_loss``) read the parts only through
    their modules, so batched seeds run the same code on stacked weights."""

    actor: TanhGaussianActor
    critic: EnsembleQ
    critic_target: EnsembleQ
    temperature: Temperature
    target_entropy: float
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer
    alpha_opt: torch.optim.Optimizer

    @classmethod
    def build(cls, config: SACNetworkSettings, obs_dim: int, act_dim: int, device: torch.device, n_critics: int = 2) -> SoftActorCritic:
        """From ``config``'s hidden, init_alpha, target_entropy (None: -act_dim) and the
        actor, critic and alpha learning rates; ``n_critics`` fused critics (SAC's twins; EDAC's N)."""
        actor = TanhGaussianActor(obs_dim, act_dim, config.hidden).to(device)
        critic = EnsembleQ(obs_dim, act_dim, config.hidden, n=n_critics).to(device)
        temperature = Temperature(config.init_alpha).to(device)
        target_entropy = -float(act_dim) if config.target_entropy is None else config.target_entropy
        return cls(
            actor,
            critic,
            target_copy(critic),
            temperature,
            target_entropy,
            adam(actor.parameters(), config.actor_lr),
            adam(critic.parameters(), config.critic_lr),
            adam(temperature.parameters(), config.alpha_lr),
        )

    def parts(self) -> dict[str, nn.Module]:
        """The modules that hold all learnable state, by name."""
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target, "temperature": self.temperature}

    def alpha(self) -> float:
        return float(self.temperature.log_alpha.detach().exp())

    @torch.no_grad()
    def soft_target(self, b: Batch, rewards: torch.Tensor, gamma: float, entropy: bool = True) -> torch.Tensor:
        """The soft Bellman target from the min over the target critics; without ``entropy``
        the next action's ``alpha * log pi`` is not subtracted (CORL's and d3rlpy's CQL)."""
        next_action, next_logp = self.actor.sample(b.next_obs)
        next_q = self.critic_target(b.next_obs, next_action).min(0).values
        if entropy:
            next_q = next_q - self.temperature.log_alpha.exp() * next_logp
        return rewards + gamma * (1.0 - b.terminated) * next_q

    def td_errors(self, b: Batch, rewards: torch.Tensor, gamma: float, entropy: bool = True) -> torch.Tensor:
        """Each row's squared TD error of the critics against :meth:`soft_target` (mean over critics)."""
        return squared_td_errors(self.critic(b.obs, b.actions), self.soft_target(b, rewards, gamma, entropy))

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's loss, E[alpha * log pi - min Q], and the sampled actions' log pi."""
        alpha = self.temperature.log_alpha.detach().exp()
        action, logp = self.actor.sample(obs)
        return (alpha * logp - self.critic(obs, action).min(0).values).mean(), logp

    def alpha_loss(self, logp: torch.Tensor) -> torch.Tensor:
        """The temperature's loss: it moves the policy's entropy towards the target."""
        return -(self.temperature.log_alpha * (logp.detach() + self.target_entropy)).mean()

    def critic_step(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of the critics' optimiser on ``loss``; its diagnostics."""
        optimizer_step(self.critic_opt, loss)
        return {"critic_loss": loss.detach()}

    def policy_step(self, obs: torch.Tensor, tau: float) -> dict[str, torch.Tensor]:
        """Policy improvement on ``obs``: the actor maximises min Q - alpha * log pi, the
        temperature moves the entropy towards the target; then the target critics follow.
        Returns the actor's loss, the temperature and the policy's entropy estimate."""
        with frozen(list(self.critic.parameters())):  # no wasted gradients for the critic
            actor_loss, logp = self.actor_loss(obs)
            optimizer_step(self.actor_opt, actor_loss)
        alpha = self.temperature.log_alpha.detach().exp()
        optimizer_step(self.alpha_opt, self.alpha_loss(logp))
        polyak_update(self.critic_target, self.critic, tau)
        return {"actor_loss": actor_loss.detach(), "alpha": alpha, "entropy": -logp.detach().mean()}


def critic_loss(config: SACFields, sac: SoftActorCritic, b: Batch) -> torch.Tensor:
    """SAC's critic loss on ``b``: half the mean squared soft TD error, summed over the twin critics."""
    target = sac.soft_target(b, b.rewards, config.gamma)
    return 0.5 * (sac.critic(b.obs, b.actions) - target).square().mean(1).sum()


@dataclass
class StackedSoftActorCritic:
    """K seeds' :class:`SoftActorCritic` on stacked weights (rlpipe.training.seedstack):
    ``seeds[k]`` is seed k's own copy, initialised as its separate run initialises it, and
    ``seeds[0]`` the template whose per-seed code runs on every seed's weights. One Adam per
    part over the stacked weights is K Adams (Adam is elementwise)."""

    seeds: list[SoftActorCritic]
    stack: SeedStack
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer
    alpha_opt: torch.optim.Optimizer
    tau: float

    @classmethod
    def build(cls, configs: Sequence[SeedStackSettings], obs_dim: int, act_dim: int, device: torch.device) -> StackedSoftActorCritic:
        """From ``configs`` (SAC's fields, equal but for ``seed``): each seed's networks built
        right after seeding, as in its own run."""
        seeds = []
        for config in configs:
            seed_everything(config.seed, config.torch_threads)
            seeds.append(SoftActorCritic.build(config, obs_dim, act_dim, device))
        stack, config = SeedStack([sac.parts() for sac in seeds]), configs[0]
        return cls(
            seeds,
            stack,
            adam(stack.parameters("actor"), config.actor_lr),
            adam(stack.parameters("critic"), config.critic_lr),
            adam(stack.parameters("temperature"), config.alpha_lr),
            config.tau,
        )

    @property
    def template(self) -> SoftActorCritic:
        return self.seeds[0]

    def update(
        self, seed_critic_loss: Callable[[Batch], tuple[torch.Tensor, ...]], b: Batch
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """One update of every seed on its slice of ``b`` ([K, B, ...]): the steps of a
        single seed's update, in the same order. ``seed_critic_loss(b)`` is per-seed code
        (reading :attr:`template`) returning the critic loss first, then any statistics;
        returns its outputs for all seeds ([K] each) and the diagnostics a single seed's
        update reports (`SoftActorCritic.critic_step`, `policy_step`), [K] each."""
        outputs = self.stack.call(seed_critic_loss, b, train="critic")
        optimizer_step(self.critic_opt, outputs[0].sum())  # the seeds share no weights: each gets its own gradient
        actor_loss, logp = self.stack.call(self.template.actor_loss, b.obs, train="actor")
        optimizer_step(self.actor_opt, actor_loss.sum())
        (log_alpha,) = self.stack.parameters("temperature")
        alpha = log_alpha.detach().exp()
        optimizer_step(self.alpha_opt, self.stack.call(self.template.alpha_loss, logp, train="temperature").sum())
        polyak_update(self.stack.parameters("critic_target"), self.stack.parameters("critic"), self.tau)
        diagnostics = {"critic_loss": outputs[0].detach(), "actor_loss": actor_loss.detach(), "alpha": alpha}
        return outputs, {**diagnostics, "entropy": -logp.detach().mean(-1)}

    @torch.no_grad()
    def explore(self, obs: np.ndarray) -> np.ndarray:
        """Every seed's sampled actions in [-1, 1] for its observations: [K, n, obs_dim] -> [K, n, act_dim]."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.stack.device)
        return self.stack.call(lambda o: self.template.actor.sample(o)[0], obs_t).cpu().numpy()

    def modules(self) -> list[dict[str, nn.Module]]:
        """Each seed's modules to save, its actor under ``"policy"`` (current after ``stack.unstack()``)."""
        return [{"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target} for sac in self.seeds]


def make_agent(config: SACFields, env: OffPolicySetup) -> Agent:
    """SAC's networks, update and sampling exploration for ``env``'s sizes and device."""
    sac = SoftActorCritic.build(config, env.obs_dim, env.act_dim, env.device)

    def update(b: Batch, _: int) -> Diagnosed:
        return {**sac.critic_step(critic_loss(config, sac, b)), **sac.policy_step(b.obs, config.tau)}

    def explore(obs: np.ndarray, *_: Any) -> np.ndarray:
        with torch.no_grad():
            return sac.actor.sample(torch.as_tensor(obs, dtype=torch.float32, device=env.device))[0].cpu().numpy()

    modules = {"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target}
    resume_state = {"actor_opt": sac.actor_opt, "critic_opt": sac.critic_opt, "alpha_opt": sac.alpha_opt, "temperature": sac.temperature}
    return Agent(sac.actor, modules, explore, update, lambda: {"alpha": sac.alpha()}, resume_state)


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
    env = setup(SPEC.name, config)
    return train_off_policy(SPEC.name, config, env, make_agent(config, env), out_dir, progress, step_sink)


def make_stacked_agent(configs: Sequence[Config], env: OffPolicySetup) -> tuple[StackedSoftActorCritic, Update]:
    """``make_agent`` for K seeds (``configs``, equal but for the seed): their stacked
    networks and the batched update of SAC's update on [K, B, ...] minibatches."""
    stacked = StackedSoftActorCritic.build(configs, env.obs_dim, env.act_dim, env.device)

    def seed_loss(b: Batch) -> tuple[torch.Tensor]:
        return (critic_loss(configs[0], stacked.template, b),)

    def update(b: Batch, _: int) -> Diagnosed:
        return stacked.update(seed_loss, b)[1]

    return stacked, update


def train_seeds(configs: Sequence[Config], out_dirs: Sequence[str | Path | None], *, progress: bool = True) -> list[TrainResult]:
    """Train SAC with every config (equal but for the seed) as one batched computation: each
    seed steps its own envs (on the CPU) and samples its own replay buffer, all seeds'
    networks update as one; each seed's run goes to its ``out_dirs`` entry as ``train``
    would write it."""
    setups: list[OffPolicySetup] = []
    try:
        for config in configs:
            setups.append(setup(SPEC.name, config))
        stacked, update = make_stacked_agent(configs, setups[0])
    except BaseException:
        for env in setups:
            env.envs.close()
        raise
    return train_off_policy_seeds(
        SPEC.name,
        configs,
        setups,
        stacked.stack,
        stacked.modules(),
        stacked.explore,
        update,
        out_dirs,
        progress,
        lambda k: {"alpha": stacked.seeds[k].alpha()},
    )
