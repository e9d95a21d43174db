"""Dynamics: fit a Gaussian dynamics ensemble (``rlpipe.nets.dynamics``) to a stored
dataset and save it for reuse (``rlpipe train mopo --set dynamics=RUN_DIR``). ``updates``
caps the fit's gradient updates; early stopping on the holdout split usually ends it first.

``metrics.json`` records the elites' holdout MSE per output (Δobs dims, then reward). The
run's eval return is that of CEM-MPC planning with the fitted model in the dataset's env
(as PETS plans), a direct test of whether the model is good enough to control with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from gymnasium import spaces

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.env_fns import reward_fn, termination_fn
from rlpipe.training import OfflineConfig, Run, TrainResult
from rlpipe.training.config import layer_sizes, positive
from rlpipe.training.env import BOX, ActionScaler
from rlpipe.training.model_based import DYNAMICS_MODULE, ModelFields, build_ensemble, dataset_batch, fit_on
from rlpipe.training.offline import dataset_metrics, load_offline
from rlpipe.training.planning import CEMPlanner, CEMSettings, ModelEnv, planner_policy

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["dynamics"]


@dataclass
class Config(ModelFields, CEMSettings, OfflineConfig):
    # The ensemble (see ModelFields): 7 members of 3 x 200, 5 elites. The evaluation plans
    # with it by CEM-MPC (CEMSettings, as rlpipe.algos.pets).
    members: int = positive(7)
    model_hidden: tuple[int, ...] = layer_sizes((200, 200, 200))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_planning(self.elites)


TUNED: dict[str, dict[str, Any]] = {
    "Pendulum-v1": dict(updates=20_000),  # a cap: early stopping ends the fit first on pendulum-mixed
}


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Fit the ensemble on ``config.dataset``, evaluate MPC with it, save it."""
    data = load_offline(SPEC.name, config, ACTION_SPACES)
    terminated, reward = termination_fn(SPEC.name, config.env_id), reward_fn(SPEC.name, config.env_id, config.reward)
    model, optimizer = build_ensemble(config, data.obs_dim, data.act_dim, data.device)
    generator = torch.Generator(device=data.device).manual_seed(config.seed)
    run = Run(SPEC.name, config, out_dir, progress)
    try:
        fit = fit_on(model, optimizer, dataset_batch(data), config, generator, known_reward=reward is not None, max_updates=config.updates)
        action_space = cast(spaces.Box, data.action_space)  # ACTION_SPACES: a Box
        planner = CEMPlanner(ModelEnv(model, action_space, terminated, reward, generator), config, data.act_dim, generator)
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
