"""PPO (clipped objective, GAE) for discrete and continuous actions on vectorised envs.

Policy and value are two MLPs fused into one ``ActorCritic`` (one batched matmul per layer);
with ``recurrent`` set, an LSTM or GRU core in front of each (``RecurrentActorCritic``, for
partially observed envs), whose hidden states are carried through the rollouts and re-run
over each env's whole rollout in the update.
Read top to bottom: config and tuned defaults, then ``train``: collect a rollout of
``num_steps`` x ``num_envs`` transitions, compute advantages (GAE), run ``num_epochs``
epochs of clipped minibatch updates (``ppo_update``, with the loss above it), evaluate on
schedule. Rollout storage and GAE are :mod:`rlpipe.training.onpolicy`; IPPO's teams learn
by the same update. Imitation learning (GAIL) reuses
``train`` with a ``reward_fn`` that replaces the env reward of each rollout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from rlpipe.algos.registry import REGISTRY
from rlpipe.errors import RlpipeError
from rlpipe.nets.networks import ActorCritic, ObsNormalizer
from rlpipe.nets.recurrent import RecurrentActorCritic
from rlpipe.training import (
    ActionScaler,
    OnlineConfig,
    Run,
    StepSink,
    TrainResult,
    VecStepper,
    make_vec_env,
    policy_fn,
    require_spaces,
    resolve_device,
    seed_everything,
)
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.diagnostics import Diagnostics
from rlpipe.training.env import BOX, DISCRETE, action_dim
from rlpipe.training.onpolicy import PPOBatch, PPOSettings, RecurrentRolloutStorage, RolloutStorage
from rlpipe.training.optim import adam, autocast, optimizer_step
from rlpipe.training.resume import Checkpointer

ACTION_SPACES = (DISCRETE, BOX)
SPEC = REGISTRY["ppo"]


@dataclass
class Config(OnlineConfig):
    env_steps: int = positive(100_000)
    num_envs: int = positive(8)
    eval_every: int = positive(10_000)
    num_steps: int = positive(32)  # rollout length per env
    num_epochs: int = positive(20)
    minibatch_size: int = positive(256)
    learning_rate: float = positive(1e-3)
    anneal: bool = True  # linearly decay learning rate and clip range to 0
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None  # stop an update's epochs early above this KL
    normalize_advantages: bool = True
    normalize_obs: bool = False
    hidden: tuple[int, ...] = layer_sizes((64, 64))
    init_log_std: float = 0.0  # continuous actions only
    # "lstm" or "gru": a recurrent core of `recurrent_hidden` units before the policy's and the value's
    # `hidden` MLPs, for envs whose observation hides part of the state; a minibatch is then whole env rollouts.
    recurrent: Literal["none", "lstm", "gru"] = "none"
    recurrent_hidden: int = positive(64)


# Tuned per env (like the SB3 zoo); anything not listed uses the Config defaults.
TUNED: dict[str, dict[str, Any]] = {
    # rl-zoo's CartPole settings (the Config defaults) with a 3x larger, linearly decayed
    # learning rate: reaches 475 in 5-15k env steps instead of 15-25k, ends at 500.
    "CartPole-v1": dict(learning_rate=3e-3),
    # Velocities hidden: the Config defaults are rl-zoo's RecurrentPPO settings for this env. At 30k
    # steps `recurrent=lstm` holds the pole 138-474 steps (seeds 0-4), the feedforward control about
    # 45 (docs/algorithms/online.md); heads of one 64-unit layer (the zoo's) held it 142-172 (seeds 0-3).
    "rlpipe/CartPoleNoVel-v1": dict(env_steps=30_000),
    # Pendulum pays its cost every step: gamma 0.9 and lr 1e-3 (as the zoo) matter most (the
    # former 0.95 / 3e-4: -963 at 200k). The initial log-std stays 0: at -0.5 seeds 3 and 9
    # never reached -300 in 100k steps (best -534, -339); at 0 seeds 0-9 reach it by 26-41k.
    # target_kl 0.02 ends an update's epochs once the policy has moved enough: without it two
    # of seeds 0-4 collapsed after reaching -300 (100k: -347.5, -769.9, -161.9, -163.0, -174.4);
    # with it 100k ends at -149.6, -194.3, -187.0, -174.3, -202.8. A 4x larger minibatch
    # (fewer updates) instead is slow: -300 only at 65-82k.
    "Pendulum-v1": dict(
        env_steps=100_000,
        num_envs=8,
        num_steps=256,
        num_epochs=10,
        minibatch_size=64,
        learning_rate=1e-3,
        gamma=0.9,
        gae_lambda=0.95,
        normalize_obs=True,
        target_kl=0.02,
    ),
}


def policy_loss(
    actor: ActorCritic | RecurrentActorCritic,
    head: torch.Tensor,
    value: torch.Tensor,
    batch: PPOBatch,
    idx: torch.Tensor,
    clip: float,
    settings: PPOSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's loss on rows ``idx`` of ``batch``, whose policy heads and values the actor gave
    as ``head`` and ``value``: clipped surrogate + ``vf_coef`` * value MSE - ``ent_coef`` *
    entropy (the value on every row, the policy terms on the acting rows); also returns its
    diagnostics, the approximate KL to the rollout policy (``approx_kl``) among them."""
    v_loss = F.mse_loss(value, batch.returns[idx])
    if batch.acting is not None:
        acting = batch.acting[idx]
        idx, head = idx[acting], head[acting]
    logp, entropy = actor.log_prob_entropy(head, batch.actions[idx])
    log_ratio = logp - batch.log_probs[idx]
    ratio = log_ratio.exp()
    adv = batch.advantages[idx]
    if settings.normalize_advantages and len(idx) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    with torch.no_grad():
        diagnostics = {
            "policy_loss": pg_loss.detach(),
            "value_loss": v_loss.detach(),
            "entropy": entropy.mean().detach(),
            "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clip_fraction": ((ratio - 1).abs() > clip).float().mean(),
        }
    return pg_loss + settings.vf_coef * v_loss - settings.ent_coef * entropy.mean(), diagnostics


def clipped_loss(
    actor: ActorCritic, batch: PPOBatch, idx: torch.Tensor, clip: float, settings: PPOSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`policy_loss` on the flattened rows ``idx``."""
    head, value = actor(batch.obs[idx])
    return policy_loss(actor, head, value, batch, idx, clip, settings)


def sequence_loss(
    actor: RecurrentActorCritic, batch: PPOBatch, rows: torch.Tensor, clip: float, settings: PPOSettings
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`policy_loss` on the valid steps of the rollout rows ``rows``, the core re-run
    over each row's sequence from its stored initial state."""
    seq = batch.sequences
    assert seq is not None
    head, value, _ = actor(seq.obs[rows], seq.initial_state[rows], seq.starts[rows])
    idx = seq.rows[rows]
    keep = idx >= 0
    return policy_loss(actor, head[keep], value[keep], batch, idx[keep], clip, settings)


def ppo_update(
    actor: ActorCritic | RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: PPOBatch,
    clip: float,
    settings: PPOSettings,
    generator: torch.Generator,
    diagnostics: Diagnostics | None = None,
) -> int:
    """``num_epochs`` epochs of shuffled minibatches (about ``minibatch_size`` rows each) of
    the clipped loss; an epoch whose last KL exceeds ``target_kl`` ends the update early.
    With ``batch.sequences`` a minibatch is a group of whole row sequences (at least one).
    Each gradient step's diagnostics go to ``diagnostics``. Returns the number of gradient steps taken."""
    n = batch.obs.shape[0] if batch.sequences is None else batch.sequences.obs.shape[0]
    n_minibatches = min(n, max(1, round(batch.obs.shape[0] / settings.minibatch_size)))
    loss_of = clipped_loss if batch.sequences is None else sequence_loss
    steps = 0
    for _ in range(settings.num_epochs):
        approx_kl = torch.zeros(())
        for idx in torch.randperm(n, generator=generator, device=batch.obs.device).tensor_split(n_minibatches):
            with autocast(settings.precision, batch.obs.device):
                loss, stats = loss_of(actor, batch, idx, clip, settings)  # type: ignore[arg-type]
            optimizer_step(optimizer, loss, settings.max_grad_norm)
            approx_kl = stats["approx_kl"]
            if diagnostics is not None:
                diagnostics.add(stats)
            steps += 1
        if settings.target_kl is not None and approx_kl > settings.target_kl:
            break
    return steps


RewardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``reward_fn(obs [T, N, obs_dim], actions [T, N] or [T, N, act_dim], valid [T, N]) -> rewards [T, N]``:
replaces the env reward of a rollout before GAE. Actions are in policy space (continuous ones
not yet clipped); ``valid`` is False on reset steps. It may learn from the rollout first."""


def train(
    config: Config,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    step_sink: StepSink | None = None,
    reward_fn: RewardFn | None = None,
    algo: str = SPEC.name,
    extra_metrics: Callable[[], dict[str, Any]] | None = None,
    extra_modules: dict[str, nn.Module] | None = None,
) -> TrainResult:
    """Train PPO; with ``out_dir`` also write checkpoint, ``metrics.json`` and DVCLive curve.

    ``reward_fn`` (see :data:`RewardFn`) trains on its rewards instead of the env's; ``algo``
    names the run, ``extra_metrics()`` adds entries to its metrics and ``extra_modules`` are
    saved in the checkpoint beside the policy (all for GAIL). With ``config.checkpoint_every``
    the full state is saved between rollouts for resuming (:mod:`rlpipe.training.resume`;
    not with a ``reward_fn``, whose learning it cannot see).
    """
    if config.checkpoint_every is not None and reward_fn is not None:
        raise RlpipeError(f"{algo} does not support --checkpoint-every yet")
    envs = make_vec_env(config.env_id, config.num_envs)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    require_spaces(algo, config.env_id, obs_space, act_space, ACTION_SPACES)
    device = resolve_device(config.device)
    rng = seed_everything(config.seed, config.torch_threads)
    discrete = isinstance(act_space, spaces.Discrete)
    obs_dim, n_act = cast(spaces.Box, obs_space).shape[0], action_dim(act_space)  # a flat Box: require_spaces checked

    actor: ActorCritic | RecurrentActorCritic
    rollout: RolloutStorage
    if config.recurrent == "none":
        actor = ActorCritic(
            obs_dim, n_act, discrete, config.hidden, normalize_obs=config.normalize_obs, init_log_std=config.init_log_std
        ).to(device)
        rollout = RolloutStorage(config.num_steps, config.num_envs, obs_dim, n_act, discrete, device)
    else:
        actor = RecurrentActorCritic(
            obs_dim,
            n_act,
            discrete,
            config.recurrent,
            config.recurrent_hidden,
            config.hidden,
            normalize_obs=config.normalize_obs,
            init_log_std=config.init_log_std,
        ).to(device)
        rollout = RecurrentRolloutStorage(actor, config.num_steps, config.num_envs, obs_dim, n_act, device)
    optimizer = adam(list(actor.parameters()), config.learning_rate, eps=1e-5)
    scaler = ActionScaler(act_space)
    stepper = VecStepper(envs, scaler, config.seed, step_sink)
    eval_policy = policy_fn(actor, scaler, device, deterministic=not config.eval_sampled_actions)
    run = Run(algo, config, out_dir, progress)
    perm_gen = torch.Generator(device=device).manual_seed(int(rng.integers(2**31)))
    # A rollout is refilled from scratch each iteration, so state saved between iterations is
    # complete; a recurrent one also carries its hidden state into the next.
    resumed = {"policy": actor, "optimizer": optimizer, "perm_gen": perm_gen, "stepper": stepper}
    checkpoints = Checkpointer(run, resumed if config.recurrent == "none" else {**resumed, "rollout": rollout})

    try:
        updates = (checkpoints.restore() or {}).get("updates", 0)
        while True:
            frac = max(0.0, 1.0 - stepper.env_steps / config.env_steps) if config.anneal else 1.0
            for group in optimizer.param_groups:
                group["lr"] = frac * config.learning_rate
            clip = frac * config.clip_coef if config.anneal else config.clip_coef

            rollout.collect(actor, stepper)
            rewards = rollout.rewards if reward_fn is None else reward_fn(rollout.obs, rollout.actions, rollout.valid).detach()
            batch = rollout.batch(rewards, config.gamma, config.gae_lambda)
            updates += ppo_update(actor, optimizer, batch, clip, config, perm_gen, run.diagnostics)
            if config.normalize_obs:
                # Statistics change between rollouts only, so stored log-probs stay exact.
                cast(ObsNormalizer, actor.obs_norm).update(batch.obs)

            run.show(stepper.env_steps, stepper.last_return)
            if run.maybe_evaluate(eval_policy, stepper.env_steps):
                break
            checkpoints.maybe_save(stepper.env_steps, {"updates": updates})
        result = run.finish(
            eval_policy,
            actor,
            {"policy": actor, **(extra_modules or {})},
            act_space,
            stepper.env_steps,
            updates,
            {"train_episodes": stepper.episodes, **(extra_metrics() if extra_metrics else {})},
        )
        checkpoints.discard()
        return result
    finally:
        run.close()
        envs.close()
