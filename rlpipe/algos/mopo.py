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

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos.sac import SoftActorCritic
from rlpipe.models.env_fns import reward_fn, termination_fn
from rlpipe.training import Batch, ReplayBuffer, TrainResult, config_for_env
from rlpipe.training.env import BOX
from rlpipe.training.model_based import (
    DYNAMICS_MODULE, MixedBatches, branched_rollout, build_ensemble, dataset_batch, fit_on, load_dynamics,
)
from rlpipe.training.offline import OfflineData, load_offline, train_offline
from rlpipe.training.planning import ModelEnv

ACTION_SPACES = (BOX,)


@dataclass
class Config:
    env_id: str = ""  # filled from the dataset's metadata
    dataset: str = "pendulum-mixed"
    store: str | None = None
    max_samples: int | None = None
    dynamics: str | None = None  # a `dynamics` run directory to start from (None: fit here)
    updates: int = 10_000  # SAC updates
    batch_size: int = 256
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    init_alpha: float = 1.0
    target_entropy: float | None = None
    hidden: tuple[int, ...] = (64, 64)
    # The dynamics ensemble and its fit (unless loaded).
    reward: str = "learned"  # "learned": the model's reward; "known": the env's reward function
    members: int = 7
    elites: int = 5
    model_hidden: tuple[int, ...] = (200, 200, 200)
    model_lr: float = 1e-3
    model_weight_decay: float = 5e-5
    model_batch_size: int = 256
    model_max_epochs: int = 20
    model_patience: int = 5
    holdout_fraction: float = 0.2
    # Penalised rollouts.
    penalty: float = 1.0  # lambda: reward - lambda * max_member ||std||
    rollout_every: int = 1_000  # SAC updates between rollouts
    rollout_batch: int = 2_000
    rollout_length: int = 5
    model_retain: int = 5  # rollouts the model buffer keeps
    real_ratio: float = 0.5
    seed: int = 0
    eval_every: int = 2_000
    eval_episodes: int = 10
    stop_at_return: float | None = None
    device: str = "cpu"
    torch_threads: int = 1


TUNED: dict[str, dict[str, Any]] = {}


def make_config(env_id: str, **overrides: Any) -> Config:
    """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
    return config_for_env(Config, TUNED, env_id, **overrides)


def dynamics_for(config: Config, data: OfflineData, generator: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The ensemble loaded from ``config.dynamics`` or fitted on the dataset, and what the
    metrics record about it."""
    if config.dynamics is not None:
        model, meta = load_dynamics(config.dynamics, config.env_id, data.obs_dim, data.act_dim, data.device)
        return model, {"dynamics_run": str(config.dynamics), "dynamics_sha256": meta["sha256"]}
    model, optimizer = build_ensemble(config, data.obs_dim, data.act_dim, data.device)
    fit = fit_on(model, optimizer, dataset_batch(data), config, generator)
    return model, {"model_holdout_mse": fit.holdout_mse, "model_holdout_loss": fit.holdout_loss,
                   "model_fit_epochs": fit.epochs, "model_fit_seconds": round(fit.seconds, 3)}


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train MOPO on ``config.dataset``; with ``out_dir`` also write checkpoint (policy,
    critics, dynamics), metrics and curve."""
    data = load_offline("mopo", config, ACTION_SPACES)
    terminated, reward = termination_fn("mopo", config.env_id), reward_fn("mopo", config.env_id, config.reward)
    generator = torch.Generator(device=data.device).manual_seed(config.seed)
    model, model_metrics = dynamics_for(config, data, generator)
    model_env = ModelEnv(model, data.action_space, terminated, reward, generator)
    sac = SoftActorCritic.build(config, data.obs_dim, data.act_dim, data.device)
    synthetic = ReplayBuffer(config.model_retain * config.rollout_batch * config.rollout_length, data.obs_dim, data.act_dim,
                             data.device, seed=config.seed + 1)
    dataset_sampler = data.sampler
    stats = {"rollout_reward": float("nan")}

    def update(b: Batch, i: int) -> None:
        if i % config.rollout_every == 0:
            before = synthetic.pos
            start = dataset_sampler.sample(config.rollout_batch).obs
            added = branched_rollout(model_env, lambda obs: sac.actor.sample(obs)[0], start, config.rollout_length, synthetic, config.penalty)
            rows = (before + torch.arange(added)) % synthetic.capacity
            stats["rollout_reward"] = float(synthetic.rewards[rows].mean())
        target = sac.soft_target(b, b.rewards, config.gamma)
        sac.critic_step(0.5 * (sac.critic(b.obs, b.actions) - target).square().mean(1).sum())
        sac.policy_step(b.obs, config.tau)

    mixed = replace(data, sampler=MixedBatches(dataset_sampler.sample, synthetic, config.real_ratio))
    modules = {"policy": sac.actor, "critic": sac.critic, "critic_target": sac.critic_target, DYNAMICS_MODULE: model}
    extra = lambda: {**model_metrics, "alpha": sac.alpha(), "penalised_model_reward": stats["rollout_reward"]}  # noqa: E731
    return train_offline("mopo", config, mixed, sac.actor, modules, update, out_dir, progress, extra)
