"""Batch-constrained Q-learning (BCQ; Fujimoto et al. 2019, and for discrete actions
Fujimoto, Conti, Ghavamzadeh, Pineau & Precup 2019).

Act only like the dataset. Continuous actions (Box): a conditional VAE learns which actions
the data takes in each state, a perturbation model may shift a generated action by at most
``max_shift`` (of the [-1, 1] range), and twin critics pick the best of such actions:
``n_candidates`` (10) in the target, ``act_candidates`` (100) when acting, as in the
paper's code. Discrete actions (Discrete): a Q-head and an imitation head (the data's
pi(a|s), by cross-entropy) share an encoder (flat vectors, images or frame stacks); only
actions with pi(a|s) / max_a pi(a|s) >= ``threshold`` may be chosen, in the double-DQN
target and when acting.

Read top to bottom: config and tuned defaults, the networks (each variant's acting part is
one policy class that ``rlpipe eval`` loads: ``BCQPolicy``, ``DiscreteBCQPolicy``), the
losses, the two variants' updates (continuous: VAE -> critics with the soft clipped
double-Q target -> perturbation -> target networks; discrete: Huber TD + cross-entropy),
then ``train``: the shared offline loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.encoders import EncoderChoice, build_encoder
from rlpipe.nets.networks import EnsembleQ, init_spec, mlp, register_policy_class
from rlpipe.training import Batch, OfflineConfig, TrainResult
from rlpipe.training.config import check_fractions, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, DISCRETE, encoder_spec
from rlpipe.training.losses import of_actions, squared_td_errors
from rlpipe.training.offline import IMAGE_OBSERVATION_KINDS, Learner, OfflineData, load_offline, require_flat_observations, train_offline
from rlpipe.training.optim import adam, frozen, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (BOX, DISCRETE)
SPEC = REGISTRY["bcq"]
LOG_STD_MIN, LOG_STD_MAX = -4.0, 15.0  # the encoder's log std range in the BCQ paper's code


@dataclass
class Config(OfflineConfig):
    updates: int = positive(20_000)
    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = positive(1e-3)  # the perturbation model
    critic_lr: float = positive(1e-3)  # the critics; discrete actions: the whole network (encoder, Q- and imitation heads)
    vae_lr: float = positive(1e-3)
    hidden: tuple[int, ...] = layer_sizes((256, 256))  # perturbation model and critics (paper: 400, 300)
    vae_hidden: tuple[int, ...] = layer_sizes((750, 750))
    latent_dim: int | None = positive(None)  # None: 2 * action_dim (the paper)
    kl_weight: float = 0.5
    max_shift: float = 0.05  # the paper's Phi
    lmbda: float = 0.75  # target = lmbda * min + (1 - lmbda) * max of the twin critics
    n_candidates: int = positive(10)  # generated actions per next state in the critics' target (the paper's code: 10)
    act_candidates: int = positive(100)  # generated actions per state when acting (the paper's code: 100)
    threshold: float = 0.3  # discrete: actions with pi(a|s) / max_a pi(a|s) below it are never chosen (the paper's tau)
    logit_penalty: float = 1e-2  # discrete: weight of the imitation logits' mean square (the paper's code)
    frame_stack: int = positive(1)  # discrete: observations seen as the last k stacked
    encoder: EncoderChoice = "auto"  # the CNN that reads images; auto: by frame size

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fractions(self, "lmbda", "threshold")


TUNED: dict[str, dict[str, Any]] = {
    # 128x128 nets held seeds 0-2 at -136 to -161 from 4k to 6k updates; 64x64 nets and
    # longer runs drifted down on some seeds.
    "Pendulum-v1": dict(updates=5_000, hidden=(128, 128), vae_hidden=(128, 128)),
}


class Perturbation(nn.Module):
    """BCQ's perturbation model: a -> clip(a + max_shift * tanh(f(s, a)), -1, 1)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], max_shift: float) -> None:
        super().__init__()
        self.max_shift = max_shift
        self.net = mlp(obs_dim + act_dim, act_dim, hidden)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        shift = self.max_shift * torch.tanh(self.net(torch.cat([obs, action], dim=-1)))
        return (action + shift).clamp(-1.0, 1.0)


@register_policy_class
class BCQPolicy(nn.Module):
    """BCQ's batch-constrained policy: ``n_candidates`` actions from the conditional VAE's
    decoder, each nudged by the perturbation model; the one the first critic values most wins.

    Holds everything acting needs (decoder, perturbation, twin critics); BCQ trains the
    VAE's encoder alongside.
    """

    kind = "bcq"

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        vae_hidden: Sequence[int] = (750, 750),
        latent_dim: int = 2,
        max_shift: float = 0.05,
        n_candidates: int = 10,
    ) -> None:
        super().__init__()
        self.spec = init_spec(BCQPolicy.__init__, locals())
        self.latent_dim, self.n_candidates = latent_dim, n_candidates
        self.decoder = mlp(obs_dim + latent_dim, act_dim, vae_hidden)
        self.perturbation = Perturbation(obs_dim, act_dim, hidden, max_shift)
        self.critic = EnsembleQ(obs_dim, act_dim, hidden, n=2)

    def decode(self, obs: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Actions in (-1, 1) for latents ``z``; by default z ~ N(0, 1) clipped to [-0.5, 0.5]
        (the generator's likely region)."""
        if z is None:
            z = torch.randn(obs.shape[0], self.latent_dim, device=obs.device).clamp(-0.5, 0.5)
        return torch.tanh(self.decoder(torch.cat([obs, z], dim=-1)))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        # Candidates are sampled either way: the argmax over them is BCQ's policy.
        batch, n = obs.shape[0], self.n_candidates
        repeated = obs.repeat_interleave(n, dim=0)  # all candidates of all states in one batch
        candidates = self.perturbation(repeated, self.decode(repeated))
        best = self.critic(repeated, candidates)[0].view(batch, n).argmax(1)
        return candidates.view(batch, n, -1)[torch.arange(batch, device=obs.device), best]


@register_policy_class
class DiscreteBCQPolicy(nn.Module):
    """Discrete BCQ's policy: a Q-head and an imitation head (logits of the data's
    pi(a|s)) on one encoder; it acts greedily on Q among the actions the data supports
    (`supported_greedy`). Without an encoder the heads are two separate MLPs, as in the
    paper's code for vector observations; with one they share it, as its Atari network does."""

    kind = "discrete_bcq"

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (256, 256),
        threshold: float = 0.3,
        encoder: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.spec = init_spec(DiscreteBCQPolicy.__init__, locals())
        self.threshold = threshold
        self.encoder, features = build_encoder(encoder, obs_dim)
        self.q = mlp(features, n_actions, hidden)
        self.imitation = mlp(features, n_actions, hidden)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values and imitation logits, each [B, n_actions]."""
        features = self.encoder(obs)
        return self.q(features), self.imitation(features)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        q, logits = self(obs)
        return supported_greedy(q, logits, self.threshold)  # greedy either way, as the paper acts


def supported_greedy(q: torch.Tensor, logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """argmax_a Q(s, a) over the actions with pi(a|s) / max_a pi(a|s) >= ``threshold``
    (pi = softmax(logits), so the ratio is exp(logit - max logit)); [B, A] -> [B]."""
    if threshold <= 0.0:
        return q.argmax(-1)
    supported = logits - logits.max(-1, keepdim=True).values >= math.log(threshold)
    return q.masked_fill(~supported, -math.inf).argmax(-1)


def generator_loss(encoder: nn.Module, policy: BCQPolicy, obs: torch.Tensor, actions: torch.Tensor, kl_weight: float) -> torch.Tensor:
    """The conditional VAE's loss: reconstruct the dataset's actions from (s, z ~ q(z | s, a))
    plus ``kl_weight`` * KL(q(z | s, a) || N(0, 1)). ``encoder(s, a)`` gives z's mean and log std."""
    mean, log_std = encoder(torch.cat([obs, actions], dim=-1)).chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    z = mean + log_std.exp() * torch.randn_like(mean)
    recon_loss = (policy.decode(obs, z) - actions).square().mean()
    kl = -0.5 * (1.0 + 2.0 * log_std - mean.square() - (2.0 * log_std).exp()).mean()
    return recon_loss + kl_weight * kl


@torch.no_grad()
def bcq_target(
    policy: BCQPolicy, critic_target: nn.Module, perturbation_target: nn.Module, b: Batch, gamma: float, lmbda: float, n: int
) -> torch.Tensor:
    """r + gamma * (1 - terminated) * max over ``n`` generated, perturbed next actions of the
    soft clipped double-Q value lmbda * min + (1 - lmbda) * max of the twin target critics.
    All n*B candidates go through the critics in one batch (row j*B + i: candidate j of state i)."""
    batch = b.next_obs.shape[0]
    next_obs = b.next_obs.repeat(n, 1)
    q = critic_target(next_obs, perturbation_target(next_obs, policy.decode(next_obs)))
    q = lmbda * q.min(0).values + (1.0 - lmbda) * q.max(0).values
    return b.rewards + gamma * (1.0 - b.terminated) * q.view(n, batch).max(0).values


@torch.no_grad()
def discrete_bcq_target(config: Config, policy: nn.Module, target: nn.Module, b: Batch) -> torch.Tensor:
    """The double-DQN target r + gamma * (1 - terminated) * Q'(s', a'), a' the online
    network's `supported_greedy` action at s'."""
    next_q, next_logits = policy(b.next_obs)
    next_action = supported_greedy(next_q, next_logits, config.threshold)
    next_value = target(b.next_obs)[0].gather(1, next_action.view(-1, 1)).squeeze(1)
    return b.rewards + config.gamma * (1.0 - b.terminated) * next_value


def discrete_bcq_loss(config: Config, policy: nn.Module, target: nn.Module, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Discrete BCQ's loss on ``b`` and its TD part: Huber TD error to `discrete_bcq_target`,
    plus the imitation head's cross-entropy and ``logit_penalty`` * mean square of its logits."""
    y = discrete_bcq_target(config, policy, target, b)
    q, logits = policy(b.obs)
    actions = b.actions.long().view(-1)
    td_loss = F.smooth_l1_loss(q.gather(1, actions.view(-1, 1)).squeeze(1), y)
    imitation_loss = F.cross_entropy(logits, actions) + config.logit_penalty * logits.square().mean()
    return td_loss + imitation_loss, td_loss.detach()


def discrete_bcq(config: Config, data: OfflineData) -> Learner:
    """Discrete BCQ: the policy and its target, the update and extra metrics."""
    encoder = encoder_spec(data.observation_space, config.frame_stack, config.encoder)
    policy = DiscreteBCQPolicy(data.obs_dim, data.act_dim, config.hidden, config.threshold, encoder).to(data.device)
    target = target_copy(policy)
    optimizer = adam(policy.parameters(), config.critic_lr)
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        loss, stats["td_loss"] = discrete_bcq_loss(config, policy, target, b)
        optimizer_step(optimizer, loss)
        polyak_update(target, policy, config.tau)
        return {"loss": loss.detach(), "td_loss": stats["td_loss"]}

    def extra() -> dict[str, Any]:
        return {name: float(value) for name, value in stats.items()}

    def td_errors(b: Batch) -> torch.Tensor:
        return squared_td_errors(of_actions(policy(b.obs)[0], b.actions), discrete_bcq_target(config, policy, target, b))

    return Learner({"policy": policy, "target": target}, update, extra_metrics=extra, td_errors=td_errors)


def continuous_bcq(config: Config, data: OfflineData) -> Learner:
    """Continuous BCQ: the policy and the networks it trains beside it, the update and extra metrics."""
    require_flat_observations(SPEC.name, config, data)
    obs_dim, act_dim, device = data.obs_dim, data.act_dim, data.device
    latent_dim = config.latent_dim or 2 * act_dim
    policy = BCQPolicy(obs_dim, act_dim, config.hidden, config.vae_hidden, latent_dim, config.max_shift, config.act_candidates).to(device)
    encoder = mlp(obs_dim + act_dim, 2 * latent_dim, config.vae_hidden).to(device)  # q(z | s, a)
    critic, perturbation = policy.critic, policy.perturbation
    critic_target, perturbation_target = target_copy(critic), target_copy(perturbation)
    vae_opt = adam([*encoder.parameters(), *policy.decoder.parameters()], config.vae_lr)
    critic_opt = adam(critic.parameters(), config.critic_lr)
    actor_opt = adam(perturbation.parameters(), config.actor_lr)
    critic_params = list(critic.parameters())
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        vae_loss = generator_loss(encoder, policy, b.obs, b.actions, config.kl_weight)
        optimizer_step(vae_opt, vae_loss)

        # Critics: the best of n generated, perturbed next actions, valued by a soft clipped
        # double-Q (mostly the min of the twins, a little of the max).
        target = bcq_target(policy, critic_target, perturbation_target, b, config.gamma, config.lmbda, config.n_candidates)
        critic_loss = (critic(b.obs, b.actions) - target).square().mean(-1).sum()
        optimizer_step(critic_opt, critic_loss)

        # Perturbation: shift generated actions towards higher Q (of the first critic).
        with torch.no_grad():
            generated = policy.decode(b.obs)
        with frozen(critic_params):
            actor_loss = -critic(b.obs, perturbation(b.obs, generated))[0].mean()
            optimizer_step(actor_opt, actor_loss)

        polyak_update(critic_target, critic, config.tau)
        polyak_update(perturbation_target, perturbation, config.tau)
        stats.update(vae_loss=vae_loss.detach(), critic_loss=critic_loss.detach())
        return {**stats, "actor_loss": actor_loss.detach()}

    def extra() -> dict[str, Any]:
        return {name: float(value) for name, value in stats.items()}

    def td_errors(b: Batch) -> torch.Tensor:
        target = bcq_target(policy, critic_target, perturbation_target, b, config.gamma, config.lmbda, config.n_candidates)
        return squared_td_errors(critic(b.obs, b.actions), target)

    modules = {"policy": policy, "encoder": encoder, "critic_target": critic_target, "perturbation_target": perturbation_target}
    return Learner(modules, update, extra_metrics=extra, td_errors=td_errors)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train BCQ on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES, observation_kinds=IMAGE_OBSERVATION_KINDS)
    learner = (discrete_bcq if data.discrete else continuous_bcq)(config, data)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
