"""Dynamics: fit a Gaussian dynamics ensemble (``rlpipe.models.dynamics``) to a stored
dataset and save it for reuse (``rlpipe train mopo --set dynamics=RUN_DIR``).

``metrics.json`` records the elites' holdout MSE per output (Δobs dims, then reward). The
run's eval return is that of CEM-MPC planning with the fitted model in the dataset's env
(as PETS plans), a direct test of whether the model is good enough to control with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos.pets import cem_settings
from rlpipe.models.env_fns import reward_fn, termination_fn
from rlpipe.training import Run, TrainResult, config_for_env
from rlpipe.training.env import BOX, ActionScaler
from rlpipe.training.model_based import DYNAMICS_MODULE, build_ensemble, dataset_batch, fit_on
from rlpipe.training.offline import dataset_metrics, load_offline
from rlpipe.training.planning import CEMPlanner, ModelEnv, planner_policy

ACTION_SPACES = (BOX,)


@dataclass
class Config:
    env_id: str = ""  # filled from the dataset's metadata
    dataset: str = "pendulum-mixed"
    store: str | None = None
    max_samples: int | None = None
    updates: int = 20_000  # cap on the fit's gradient updates (early stopping usually ends it first)
    seed: int = 0
    members: int = 7
    elites: int = 5
    model_hidden: tuple[int, ...] = (200, 200, 200)
    model_lr: float = 1e-3
    model_weight_decay: float = 5e-5
    model_batch_size: int = 256
    model_max_epochs: int = 20
    model_patience: int = 5
    holdout_fraction: float = 0.2
    # The evaluation: CEM-MPC with the model (see rlpipe.algos.pets).
    reward: str = "known"
    horizon: int = 25
    population: int = 50
    elite_fraction: float = 0.2
    iterations: int = 5
    particles: int = 1
    init_std: float = 0.5
    smoothing: float = 0.1
    eval_every: int = 20_000
    eval_episodes: int = 10
    stop_at_return: float | None = None
    device: str = "cpu"
    torch_threads: int = 1


TUNED: dict[str, dict[str, Any]] = {}


def make_config(env_id: str, **overrides: Any) -> Config:
    """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
    return config_for_env(Config, TUNED, env_id, **overrides)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Fit the ensemble on ``config.dataset``, evaluate MPC with it, save it."""
    data = load_offline("dynamics", config, ACTION_SPACES)
    terminated, reward = termination_fn("dynamics", config.env_id), reward_fn("dynamics", config.env_id, config.reward)
    model, optimizer = build_ensemble(config, data.obs_dim, data.act_dim, data.device)
    generator = torch.Generator(device=data.device).manual_seed(config.seed)
    run = Run("dynamics", config, out_dir, progress, unit="updates")
    try:
        fit = fit_on(model, optimizer, dataset_batch(data), config, generator, max_updates=config.updates)
        planner = CEMPlanner(ModelEnv(model, data.action_space, terminated, reward, generator), cem_settings(config), data.act_dim, generator)
        eval_policy = planner_policy(planner, ActionScaler(data.action_space), data.device)
        extra = {
            **dataset_metrics(data),
            "model_holdout_mse": fit.holdout_mse,
            "model_holdout_loss": fit.holdout_loss,
            "model_fit_epochs": fit.epochs,
            "model_fit_seconds": round(fit.seconds, 3),
        }
        return run.finish(eval_policy, model, {DYNAMICS_MODULE: model}, data.action_space, 0, fit.updates, extra)
    finally:
        run.close()
