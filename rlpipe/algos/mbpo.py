"""MBPO: model-based policy optimisation (Janner et al. 2019) -- SAC on real transitions
mixed with short model rollouts branched from real states.

Read top to bottom: config and tuned defaults, ``ModelAugmentedReplay`` (the replay SAC
samples: real transitions as they arrive; every ``model_train_every`` env steps the
dynamics ensemble is refitted on them and rolled out with the current policy from
``rollout_batch`` real states for ``rollout_length`` steps into a model buffer; minibatches
are ``real_ratio`` real), then ``train``: SAC's agent (``rlpipe.algos.sac.make_agent``) in
the shared off-policy loop with that replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rlpipe.algos.sac import make_agent
from rlpipe.models.dynamics import FitReport
from rlpipe.models.env_fns import reward_fn, termination_fn
from rlpipe.training import Batch, ReplayBuffer, StepBatch, TrainResult, config_for_env
from rlpipe.training.env import BOX
from rlpipe.training.model_based import DYNAMICS_MODULE, MixedBatches, branched_rollout, buffer_contents, build_ensemble, fit_on
from rlpipe.training.offpolicy import Agent, OffPolicySetup, setup, train_off_policy
from rlpipe.training.planning import ModelEnv
from rlpipe.training.rollout import EpisodeReturns

ACTION_SPACES = (BOX,)


@dataclass
class Config:
    env_id: str = "Pendulum-v1"
    env_steps: int = 4_000
    seed: int = 0
    num_envs: int = 1
    # SAC (see rlpipe.algos.sac).
    buffer_size: int = 100_000
    batch_size: int = 256
    gamma: float = 0.99
    tau: float = 0.005
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    init_alpha: float = 1.0
    target_entropy: float | None = None
    hidden: tuple[int, ...] = (64, 64)
    learning_starts: int = 250  # uniform random actions before this many env steps
    updates_per_step: float = 10.0  # SAC updates per env step (the text: 10)
    # The dynamics ensemble and its fit.
    reward: str = "learned"  # "learned": the model's reward; "known": the env's reward function
    members: int = 7
    elites: int = 5
    model_hidden: tuple[int, ...] = (200, 200, 200, 200)
    model_lr: float = 1e-3
    model_weight_decay: float = 5e-5
    model_batch_size: int = 256
    model_max_epochs: int = 50
    model_patience: int = 5
    holdout_fraction: float = 0.2
    # Branched rollouts.
    model_train_every: int = 250  # env steps between model refits (and rollouts)
    rollout_batch: int = 2_000  # real start states per refit
    rollout_length: int = 1
    model_retain: int = 4  # refits whose rollouts the model buffer keeps
    real_ratio: float = 0.5  # share of real transitions per minibatch (the text: 0.5)
    eval_every: int = 1_000
    eval_episodes: int = 10
    stop_at_return: float | None = None
    device: str = "cpu"
    torch_threads: int = 1


TUNED: dict[str, dict[str, Any]] = {}


def make_config(env_id: str, **overrides: Any) -> Config:
    """The tuned config for ``env_id`` with ``overrides`` (None values ignored) applied."""
    return config_for_env(Config, TUNED, env_id, **overrides)


class ModelAugmentedReplay:
    """The replay interface of the off-policy loop over real and model transitions."""

    def __init__(self, config: Config, env: OffPolicySetup, agent: Agent, generator: torch.Generator) -> None:
        self.config, self.agent, self.generator = config, agent, generator
        capacity = min(config.buffer_size, config.env_steps + config.num_envs)
        self.real = ReplayBuffer(capacity, env.obs_dim, env.act_dim, env.device, seed=config.seed)
        synthetic = config.model_retain * config.rollout_batch * config.rollout_length
        self.synthetic = ReplayBuffer(synthetic, env.obs_dim, env.act_dim, env.device, seed=config.seed + 1)
        self.model, self.optimizer = build_ensemble(config, env.obs_dim, env.act_dim, env.device)
        terminated, reward = termination_fn("mbpo", config.env_id), reward_fn("mbpo", config.env_id, config.reward)
        self.model_env = ModelEnv(self.model, env.action_space, terminated, reward, generator)
        self.batches = MixedBatches(self.real.sample, self.synthetic, config.real_ratio)
        self.fits: list[FitReport] = []
        self.next_refit = config.learning_starts

    def __len__(self) -> int:
        return len(self.real)

    def store(self, step: StepBatch) -> None:
        self.real.store(step)
        if len(self.real) >= self.next_refit:
            self.refit_and_roll_out()
            self.next_refit += self.config.model_train_every

    def refit_and_roll_out(self) -> None:
        self.fits.append(fit_on(self.model, self.optimizer, buffer_contents(self.real), self.config, self.generator))
        start = self.real.sample(self.config.rollout_batch).obs
        policy = lambda obs: self.agent.actor.sample(obs)[0]  # noqa: E731
        branched_rollout(self.model_env, policy, start, self.config.rollout_length, self.synthetic)

    def sample(self, batch_size: int) -> Batch:
        return self.batches.sample(batch_size)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train MBPO; with ``out_dir`` also write checkpoint (policy, critics, dynamics),
    ``metrics.json`` (with every training episode's return) and the DVCLive curve."""
    env = setup("mbpo", config)
    agent = make_agent(config, env)
    replay = ModelAugmentedReplay(config, env, agent, torch.Generator(device=env.device).manual_seed(config.seed))
    episodes = EpisodeReturns()
    sac_metrics = agent.extra_metrics

    def extra_metrics() -> dict[str, Any]:
        fits = replay.fits
        return {
            **sac_metrics(),
            "episode_returns": episodes.returns,
            "model_fits": len(fits),
            "model_fit_seconds": round(sum(f.seconds for f in fits), 3),
            **({"model_holdout_mse": fits[-1].holdout_mse, "model_holdout_loss": fits[-1].holdout_loss} if fits else {}),
        }

    agent = replace(agent, modules={**agent.modules, DYNAMICS_MODULE: replay.model}, extra_metrics=extra_metrics)
    return train_off_policy("mbpo", config, env, agent, out_dir, progress, episodes, replay)
