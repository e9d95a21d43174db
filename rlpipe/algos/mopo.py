"""MOPO: model-based offline policy optimisation (Yu et al. 2020) -- MBPO on a fixed
dataset, with the model's rewards penalised by its uncertainty.

Read top to bottom: config and tuned defaults, then ``train``: the dynamics ensemble is
fitted on the dataset (or loaded from a ``dynamics`` run, ``--set dynamics=RUN_DIR``);
every ``rollout_every`` SAC updates the current policy is rolled out in the model for
``rollout_length`` steps from ``rollout_batch`` dataset states, each model reward lowered
by ``penalty * max over members of ||std||``; SAC (``rlpipe.algos.sac.SoftActorCritic``)
learns from minibatches of ``real_ratio`` dataset and the rest model transitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from gymnasium import spaces

from rlpipe.algos.registry import REGISTRY
from rlpipe.algos.sac import SACFields, SoftActorCritic
from rlpipe.nets.env_fns import reward_fn, termination_fn
from rlpipe.training import Batch, OfflineConfig, ReplayBuffer, TrainResult
from rlpipe.training.config import check_fractions, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX
from rlpipe.training.model_based import (
    DYNAMICS_MODULE,
    MixedBatches,
    ModelFields,
    branched_rollout,
    build_ensemble,
    dataset_batch,
    fit_on,
    load_dynamics,
)
from rlpipe.training.offline import Learner, OfflineData, load_offline, train_offline
from rlpipe.training.planning import ModelEnv

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["mopo"]


@dataclass
class Config(ModelFields, SACFields, OfflineConfig):
    dynamics: str | None = None  # a `dynamics` run directory to start from (None: fit here)
    # The dynamics ensemble and its fit, unless loaded (see ModelFields): 7 members of
    # 3 x 200, 5 elites. The reward is learned, as in the MOPO paper, whose penalty is the
    # model's uncertainty over (next obs, reward). With Pendulum's known reward (the fit
    # then scores Δobs alone) MOPO scored -1554.8 and -1545.2 on seeds 5 and 6 of
    # pendulum-expert-sampled, no better than penalty 0 (-1535.9 on seed 5).
    reward: Literal["auto", "known", "learned"] = "learned"
    members: int = positive(7)
    model_hidden: tuple[int, ...] = layer_sizes((200, 200, 200))
    # Penalised rollouts.
    penalty: float = 1.0  # lambda: reward - lambda * max_member ||std||
    rollout_every: int = positive(1_000)  # SAC updates between rollouts
    rollout_batch: int = positive(2_000)
    rollout_length: int = positive(5)
    model_retain: int = positive(5)  # rollouts the model buffer keeps
    real_ratio: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fractions(self, "real_ratio")


TUNED: dict[str, dict[str, Any]] = {
    # Penalty 10, chosen on seeds 0-2: the model is confident on pendulum-mixed (the penalty
    # is ~0.15 per unit of lambda per step, rewards -1 to -2), and with lambda 1 or 2.5 SAC
    # learnt, then fell into spinning the pendulum through the top on some seeds.
    "Pendulum-v1": dict(updates=10_000, eval_every=2_000, hidden=(64, 64), actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3, penalty=10.0),
}


def dynamics_for(config: Config, data: OfflineData, generator: torch.Generator, known_reward: bool) -> tuple[Any, dict[str, Any]]:
    """The ensemble loaded from ``config.dynamics`` or fitted on the dataset, and what the
    metrics record about it."""
    if config.dynamics is not None:
        model, meta = load_dynamics(config.dynamics, config.env_id, data.obs_dim, data.act_dim, data.device)
        return model, {"dynamics_run": str(config.dynamics), "dynamics_sha256": meta["sha256"]}
    model, optimizer = build_ensemble(config, data.obs_dim, data.act_dim, data.device)
    fit = fit_on(model, optimizer, dataset_batch(data), config, generator, known_reward=known_reward)
    return model, {
        "model_holdout_mse": fit.holdout_mse,
        "model_holdout_loss": fit.holdout_loss,
        "model_fit_epochs": fit.epochs,
        "model_fit_seconds": round(fit.seconds, 3),
    }


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train MOPO on ``config.dataset``; with ``out_dir`` also write checkpoint (policy,
    critics, dynamics), metrics and curve."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    terminated, reward = termination_fn(SPEC.name, config.env_id), reward_fn(SPEC.name, config.env_id, config.reward)
    generator = torch.Generator(device=data.device).manual_seed(config.seed)
    model, model_metrics = dynamics_for(config, data, generator, known_reward=reward is not None)
    model_env = ModelEnv(model, cast(spaces.Box, data.action_space), terminated, reward, generator)  # ACTION_SPACES: a Box
    sac = SoftActorCritic.build(config, data.obs_dim, data.act_dim, data.device)
    synthetic = ReplayBuffer(
        config.model_retain * config.rollout_batch * config.rollout_length, data.obs_dim, data.act_dim, data.device, seed=config.seed + 1
    )
    dataset_sampler = data.sampler
    stats = {"rollout_reward": float("nan")}

    def update(b: Batch, i: int) -> Diagnosed:
        if i % config.rollout_every == 0:
            before = synthetic.pos
            start = dataset_sampler.sample(config.rollout_batch).obs
            added = branched_rollout(
                model_env, lambda obs: sac.actor.sample(obs)[0], start, config.rollout_length, synthetic, config.penalty
            )
            rows = (before + torch.arange(added)) % synthetic.capacity
            stats["rollout_reward"] = float(synthetic.rewards[rows].mean())
        target = sac.soft_target(b, b.rewards, config.gamma)
        critic = sac.critic_step(0.5 * (sac.critic(b.obs, b.actions) - target).square().mean(1).sum())
        return {**critic, **sac.policy_step(b.obs, config.tau)}

    # Not a TransitionSampler, so train_offline runs the updates eagerly, never as a CUDA
    # graph: the rollouts every rollout_every updates are host work a graph cannot replay.
    mixed = MixedBatches(dataset_sampler.sample, synthetic, config.real_ratio)
    modules = {"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target, DYNAMICS_MODULE: model}
    extra = lambda: {**model_metrics, "alpha": sac.alpha(), "penalised_model_reward": stats["rollout_reward"]}  # noqa: E731
    learner = Learner(modules, update, sampler=mixed, extra_metrics=extra)
    return train_offline(SPEC.name, config, data, learner, out_dir, progress)
