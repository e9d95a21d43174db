"""Conservative Q-learning (CQL): Q-learning on a fixed dataset with a penalty that pushes
Q down on actions the data does not support and up on the dataset's own actions.

Read top to bottom: config and tuned defaults, then the two variants and ``train``:

- continuous actions (Box): SAC (tanh-Gaussian actor, fused twin critics, automatic
  entropy tuning) whose critic loss adds ``beta * (logsumexp_a Q(s, a) - Q(s, a_data))``.
  The logsumexp over the action space is estimated by importance sampling, as in the
  reference text: ``num_sampled_actions`` uniform actions and as many from the current
  policy at s and at s', each Q minus the log-density of its proposal. The data actions
  and all sampled ones go through the fused critics in one batched pass (split into
  cache-sized row blocks on CPU).
- discrete actions (Discrete): DQN (a Q-network over actions and a target network) whose
  TD loss adds ``beta * (logsumexp_a Q(s, a) - Q(s, a_data))``, exact over the actions;
  with ``quantiles`` > 0 the base is QR-DQN (the CQL paper's Atari runs): the Q-network
  outputs return quantiles trained with the quantile Huber loss, and the penalty acts on
  their means. Observations may be flat vectors, images or frame stacks (an encoder reads
  them); the continuous variant reads flat vectors only.

``train_seeds`` trains several seeds as one batched computation
(rlpipe.training.seedstack): the same per-seed losses on stacked weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.algos.sac import SoftActorCritic, StackedSoftActorCritic
from rlpipe.errors import RlpipeError
from rlpipe.nets.encoders import EncoderChoice
from rlpipe.nets.networks import EnsembleQ, GreedyQPolicy, TanhGaussianActor
from rlpipe.training import Batch, OfflineConfig, TrainResult, Update
from rlpipe.training.config import FinetuneFields, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, DISCRETE, encoder_spec
from rlpipe.training.losses import of_actions, quantile_huber_loss, squared_td_errors
from rlpipe.training.offline import IMAGE_OBSERVATION_KINDS, Learner, OfflineData, load_offline, require_flat_observations, train_offline
from rlpipe.training.optim import adam, optimizer_step, polyak_update, target_copy
from rlpipe.training.seeding import seed_everything
from rlpipe.training.seedstack import SeedStack, train_offline_seeds

ACTION_SPACES = (BOX, DISCRETE)
SPEC = REGISTRY["cql"]
CPU_BLOCK_ROWS = 512  # critic rows per pass on CPU (see data_and_sampled_q)


@dataclass
class Config(FinetuneFields, OfflineConfig):
    updates: int = positive(20_000)
    batch_size: int = positive(256)
    gamma: float = 0.99
    tau: float = 0.005  # target network averaging (both variants)
    actor_lr: float = positive(1e-4)
    critic_lr: float = positive(3e-4)  # the Q-network's learning rate in the discrete variant
    alpha_lr: float = positive(3e-4)
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -action_dim
    # Subtract alpha * log pi(a'|s') in the critic's target, as SAC does; CORL's and d3rlpy's CQL
    # leave it out (false). Kept on by default: every documented CQL and Cal-QL result used it.
    backup_entropy: bool = True
    hidden: tuple[int, ...] = layer_sizes((256, 256))
    beta: float = 5.0  # weight of the conservative term (the text: 5)
    num_sampled_actions: int = positive(5)  # per proposal (uniform, pi(s), pi(s')) and state (the text: 5)
    td_loss: Literal["mse", "huber"] = "mse"
    reward_scale: float = 1.0  # rewards are learnt as (r + reward_shift) * reward_scale
    reward_shift: float = 0.0
    quantiles: int = 0  # discrete actions: 0 a DQN base, N > 0 QR-DQN with N quantiles and its loss, not td_loss (the paper on Atari: 200)
    frame_stack: int = positive(1)  # discrete actions: observations seen as the last k stacked
    encoder: EncoderChoice = "auto"  # the CNN that reads images; auto: by frame size

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta < 0:
            raise RlpipeError(f"setting beta={self.beta!r}: expected a number >= 0 (the conservative weight)")
        if self.quantiles < 0:
            raise RlpipeError(f"setting quantiles={self.quantiles!r}: expected a number >= 0 (0: DQN)")


TUNED: dict[str, dict[str, Any]] = {
    # Small nets and 1e-3 learning rates learn Pendulum in ~4k updates; beta 2 kept every
    # seed we tried stable from there on (beta 1 and 5 both had late collapses).
    "Pendulum-v1": dict(updates=8_000, hidden=(64, 64), actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3, beta=2.0),
    "CartPole-v1": dict(updates=2_000, td_loss="huber"),  # DQN's Huber loss; 500 from 1k updates
}


def td_error_loss(config: Config, q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean TD loss per critic, summed over critics (q: [N, B] or [B], target: [B])."""
    fn = F.mse_loss if config.td_loss == "mse" else F.smooth_l1_loss
    return fn(q, target.expand_as(q), reduction="none").mean(-1).sum()


def proposal_samples(actor: TanhGaussianActor, obs: torch.Tensor, next_obs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K actions per state from each of CQL's proposals: uniform on [-1, 1]^d, pi(.|s) and
    pi(.|s'); [3K, B, d] and their log-densities under their proposal, [3K, B]. Each
    policy's K samples come from one actor pass over the B states."""
    batch, act_dim = obs.shape[0], cast(int, actor.spec["act_dim"])
    uniform = torch.rand(k, batch, act_dim, device=obs.device) * 2.0 - 1.0  # not uniform_: batched seeds draw with vmap
    current, current_logp = actor.sample(obs, n=k)
    following, following_logp = actor.sample(next_obs, n=k)
    uniform_logp = torch.full((k, batch), act_dim * math.log(0.5), device=obs.device)
    return torch.cat([uniform, current, following]), torch.cat([uniform_logp, current_logp, following_logp])


def data_and_sampled_q(
    critic: EnsembleQ, obs: torch.Tensor, actions: torch.Tensor, sampled: torch.Tensor, block_rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q of the dataset's actions [N, B] and of ``sampled`` actions [S, B, d] -> [N, S, B], all
    valued at ``obs``, in one critic pass over the B + S*B rows (row s*B + i: state i).

    ``block_rows`` splits the pass into blocks of that many rows (None: one pass), with the
    same values and gradients. On CPU, blocks whose activations stay in cache make a CQL
    update 1.4x faster (one pass: 16 MB per layer at 256x256, batch 256, K = 10); on a GPU
    one pass is best.
    """
    n_samples, batch = sampled.shape[:2]
    rows_obs = obs.repeat(1 + n_samples, 1)
    rows_actions = torch.cat([actions, sampled.reshape(-1, actions.shape[-1])])
    if block_rows is None:
        q = critic(rows_obs, rows_actions)
    else:
        q = torch.cat([critic(o, a) for o, a in zip(rows_obs.split(block_rows), rows_actions.split(block_rows))], dim=1)
    return q[:, :batch], q[:, batch:].view(critic.n, n_samples, batch)


def conservative_gap(q_sampled: torch.Tensor, log_density: torch.Tensor, q_data: torch.Tensor) -> torch.Tensor:
    """CQL's penalty per critic, E_s[logsumexp_a Q(s, a) - Q(s, a_data)], summed over critics.

    ``q_sampled`` [N, S, B]: Q of S sampled actions per state; ``log_density`` [S, B]: each
    sample's log-density under the proposal it came from. Importance weighting:
    logsumexp(Q - log q) - log S estimates log of the integral of exp(Q) over actions; the
    constant has no gradient and is dropped, as in the text. ``q_data`` [N, B].
    """
    return (torch.logsumexp(q_sampled - log_density, dim=1) - q_data).mean(-1).sum()


def bounded_policy_q(q_sampled: torch.Tensor, lower_bound: torch.Tensor, k: int) -> torch.Tensor:
    """Cal-QL's calibration of ``q_sampled`` [N, 3K, B] (`proposal_samples`' order): the Q of
    the policy's proposals (pi(.|s), pi(.|s'): all but the first ``k``, the uniform ones)
    raised to at least ``lower_bound`` [B]."""
    uniform, policy = q_sampled[:, :k], q_sampled[:, k:]
    return torch.cat([uniform, torch.maximum(policy, lower_bound)], dim=1)


def critic_loss(
    config: Config,
    sac: SoftActorCritic,
    b: Batch,
    block_rows: int | None,
    reference: torch.Tensor | None = None,
    floor: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAC-based CQL's critic loss on ``b``, TD loss + beta * conservative gap, the gap, and
    the fraction of the policy proposals' Q values below ``reference`` [B] (the rows'
    returns-to-go; 0 without). With ``floor`` (Cal-QL) those values enter the gap raised to
    the reference (`bounded_policy_q`); without it, or without a reference, CQL's gap."""
    target = sac.soft_target(b, (b.rewards + config.reward_shift) * config.reward_scale, config.gamma, config.backup_entropy)
    with torch.no_grad():
        sampled, log_density = proposal_samples(sac.actor, b.obs, b.next_obs, config.num_sampled_actions)
    # The data actions and all 3*K*B sampled ones (valued at s) in one critic pass.
    q_data, q_sampled = data_and_sampled_q(sac.critic, b.obs, b.actions, sampled, block_rows)
    below_rate = torch.zeros((), device=q_data.device)
    if reference is not None:
        below_rate = (q_sampled[:, config.num_sampled_actions :] < reference).float().mean()
        if floor:
            q_sampled = bounded_policy_q(q_sampled, reference, config.num_sampled_actions)
    gap = conservative_gap(q_sampled, log_density, q_data)
    return td_error_loss(config, q_data, target) + config.beta * gap, gap.detach(), below_rate.detach()


def _block_rows(device: torch.device) -> int | None:
    return CPU_BLOCK_ROWS if device.type == "cpu" else None


def require_continuous_settings(config: Config, data: OfflineData) -> None:
    """Refuse what only the discrete variant reads: images, frame stacks, quantiles."""
    require_flat_observations(SPEC.name, config, data)
    if config.quantiles:
        raise RlpipeError(
            f"setting quantiles={config.quantiles}: a QR-DQN base needs discrete actions, {data.info.name!r} has continuous ones"
        )


def continuous_cql(config: Config, data: OfflineData, *, reference_returns: bool = False, floor: bool = False) -> Learner:
    """SAC-based CQL: its networks, update and extra metrics.
    ``reference_returns``: the batches carry returns-to-go, and metric ``bound_rate`` is the
    fraction of the policy proposals' Q values below them; with ``floor``, Cal-QL's, those
    values are raised to them in the penalty (`critic_loss`)."""
    require_continuous_settings(config, data)
    sac = SoftActorCritic.build(config, data.obs_dim, data.act_dim, data.device)
    block_rows = _block_rows(data.device)
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        reference = b.returns_to_go if reference_returns else None
        loss, stats["conservative_gap"], stats["bound_rate"] = critic_loss(config, sac, b, block_rows, reference, floor)
        diagnostics = {**sac.critic_step(loss), **sac.policy_step(b.obs, config.tau), "conservative_gap": stats["conservative_gap"]}
        return {**diagnostics, "bound_rate": stats["bound_rate"]} if reference_returns else diagnostics

    def extra() -> dict[str, Any]:
        metrics = {"alpha": sac.alpha(), "conservative_gap": float(stats.get("conservative_gap", math.nan))}
        return {**metrics, "bound_rate": float(stats.get("bound_rate", math.nan))} if reference_returns else metrics

    def td_errors(b: Batch) -> torch.Tensor:
        return sac.td_errors(b, (b.rewards + config.reward_shift) * config.reward_scale, config.gamma, config.backup_entropy)

    modules = {"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target}
    return Learner(modules, update, extra_metrics=extra, td_errors=td_errors)


@torch.no_grad()
def dqn_target(q_target: nn.Module, b: Batch, rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """DQN's target rewards + gamma * (1 - terminated) * max_a Q'(s', a)."""
    return rewards + gamma * (1.0 - b.terminated) * q_target(b.next_obs).max(-1).values


@torch.no_grad()
def quantile_target(q_target: GreedyQPolicy, b: Batch, rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """QR-DQN's target quantiles [B, N]: rewards + gamma * (1 - terminated) * theta'(s', a*),
    a* the target network's greedy action (by the quantiles' mean)."""
    next_quantiles = q_target.quantile_values(b.next_obs)
    best = of_actions(next_quantiles, next_quantiles.mean(-1).argmax(-1))
    return rewards.unsqueeze(-1) + gamma * (1.0 - b.terminated).unsqueeze(-1) * best


def dqn_loss(config: Config, q_net: GreedyQPolicy, q_target: GreedyQPolicy, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """DQN- (or QR-DQN-) based CQL's loss on ``b``, TD loss + beta * the exact conservative
    gap on the Q-values (the quantiles' means), and the gap."""
    rewards = (b.rewards + config.reward_shift) * config.reward_scale
    if config.quantiles:
        quantiles = q_net.quantile_values(b.obs)
        q_all = quantiles.mean(-1)
        td_loss = quantile_huber_loss(of_actions(quantiles, b.actions), quantile_target(q_target, b, rewards, config.gamma))
    else:
        q_all = q_net(b.obs)
        td_loss = td_error_loss(config, of_actions(q_all, b.actions), dqn_target(q_target, b, rewards, config.gamma))
    gap = (torch.logsumexp(q_all, dim=-1) - of_actions(q_all, b.actions)).mean()
    return td_loss + config.beta * gap, gap.detach()


def q_network(config: Config, data: OfflineData) -> GreedyQPolicy:
    """The Q-network (and greedy policy) of discrete CQL for ``data``'s observations."""
    encoder = encoder_spec(data.observation_space, config.frame_stack, config.encoder)
    return GreedyQPolicy(data.obs_dim, data.act_dim, config.hidden, encoder=encoder, quantiles=config.quantiles).to(data.device)


def discrete_cql(config: Config, data: OfflineData) -> Learner:
    """DQN-based CQL: the greedy Q-policy (``modules["policy"]``) and its target, the update and extra metrics."""
    q_net = q_network(config, data)
    q_target = target_copy(q_net)
    optimizer = adam(q_net.parameters(), config.critic_lr)
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        loss, stats["conservative_gap"] = dqn_loss(config, q_net, q_target, b)
        optimizer_step(optimizer, loss)
        polyak_update(q_target, q_net, config.tau)
        return {"loss": loss.detach(), "conservative_gap": stats["conservative_gap"]}

    def extra() -> dict[str, Any]:
        return {"conservative_gap": float(stats.get("conservative_gap", math.nan))}

    def td_errors(b: Batch) -> torch.Tensor:  # of the Q-values (the quantiles' means on a QR-DQN base)
        rewards = (b.rewards + config.reward_shift) * config.reward_scale
        if config.quantiles:
            taken = of_actions(q_net.quantile_values(b.obs), b.actions).mean(-1)
            return squared_td_errors(taken, quantile_target(q_target, b, rewards, config.gamma).mean(-1))
        return squared_td_errors(of_actions(q_net(b.obs), b.actions), dqn_target(q_target, b, rewards, config.gamma))

    return Learner({"policy": q_net, "q_target": q_target}, update, extra_metrics=extra, td_errors=td_errors)


BatchedCQL = tuple[SeedStack, list[dict[str, nn.Module]], Update, Callable[[int], dict[str, Any]]]


def batched_continuous_cql(configs: Sequence[Config], data: OfflineData) -> BatchedCQL:
    """SAC-based CQL for K seeds on stacked weights: the stack, each seed's modules to save,
    the batched update ([K, B, ...] minibatches) and seed k's extra metrics."""
    require_continuous_settings(configs[0], data)
    stacked = StackedSoftActorCritic.build(configs, data.obs_dim, data.act_dim, data.device)
    losses = partial(critic_loss, configs[0], stacked.template, block_rows=_block_rows(data.device))
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _i: int) -> Diagnosed:  # per seed: the steps of `continuous_cql`'s update
        (_, stats["conservative_gap"], _), diagnostics = stacked.update(losses, b)
        return {**diagnostics, "conservative_gap": stats["conservative_gap"]}

    def extra(k: int) -> dict[str, Any]:  # read after the stack is unstacked into the seeds' modules
        return {"alpha": stacked.seeds[k].alpha(), "conservative_gap": float(stats["conservative_gap"][k]) if stats else math.nan}

    return stacked.stack, stacked.modules(), update, extra


def batched_discrete_cql(configs: Sequence[Config], data: OfflineData) -> BatchedCQL:
    """DQN-based CQL for K seeds on stacked weights (see `batched_continuous_cql`)."""
    modules = []
    for config in configs:
        seed_everything(config.seed, config.torch_threads)
        q_net = q_network(config, data)
        modules.append({"policy": q_net, "q_target": target_copy(q_net)})
    stack, config = SeedStack(modules), configs[0]
    optimizer = adam(stack.parameters("policy"), config.critic_lr)
    losses = partial(dqn_loss, config, modules[0]["policy"], modules[0]["q_target"])
    stats: dict[str, torch.Tensor] = {}

    def update(b: Batch, _: int) -> Diagnosed:
        loss, stats["conservative_gap"] = stack.call(losses, b, train="policy")
        optimizer_step(optimizer, loss.sum())
        polyak_update(stack.parameters("q_target"), stack.parameters("policy"), config.tau)
        return {"loss": loss.detach(), "conservative_gap": stats["conservative_gap"]}

    def extra(k: int) -> dict[str, Any]:
        return {"conservative_gap": float(stats["conservative_gap"][k]) if stats else math.nan}

    return stack, cast("list[dict[str, nn.Module]]", modules), update, extra  # GreedyQPolicy modules


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train CQL on ``config.dataset``; with ``out_dir`` also write checkpoint, metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES, observation_kinds=IMAGE_OBSERVATION_KINDS)
    learner = (discrete_cql if data.discrete else continuous_cql)(config, data)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)


def train_seeds(configs: Sequence[Config], out_dirs: Sequence[str | Path | None], *, progress: bool = True) -> list[TrainResult]:
    """Train CQL with every config (equal but for the seed) as one batched computation; each
    seed's run goes to its ``out_dirs`` entry as ``train`` would write it."""
    if configs[0].finetune_env_steps:
        raise RlpipeError("online fine-tuning trains one seed at a time: run each seed with `rlpipe train cql`")
    data = load_offline(SPEC.name, configs[0], ACTION_SPACES, observation_kinds=IMAGE_OBSERVATION_KINDS)
    stack, modules, update, extra = (batched_discrete_cql if data.discrete else batched_continuous_cql)(configs, data)
    return train_offline_seeds(SPEC.name, configs, data, stack, modules, update, out_dirs, progress, extra)
