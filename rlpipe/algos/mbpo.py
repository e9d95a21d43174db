"""MBPO: model-based policy optimisation (Janner et al. 2019) -- SAC on real transitions
mixed with short model rollouts branched from real states.

Read top to bottom: config and tuned defaults, ``ModelAugmentedReplay`` (the replay SAC
samples: real transitions as they arrive; every ``model_train_every`` env steps the
dynamics ensemble is refitted on them and rolled out with the current policy from
``rollout_batch`` real states for the ``rollout_schedule``'s length into a model buffer; minibatches
are ``real_ratio`` real), then ``train``: SAC's agent (``rlpipe.algos.sac.make_agent``) in
the shared off-policy loop with that replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from gymnasium import spaces

from rlpipe.algos.registry import REGISTRY
from rlpipe.algos.sac import SACFields, make_agent
from rlpipe.envs.stepper import EpisodeReturns
from rlpipe.errors import RlpipeError
from rlpipe.nets.dynamics import FitReport
from rlpipe.nets.env_fns import reward_fn, termination_fn
from rlpipe.nets.networks import TanhGaussianActor
from rlpipe.training import Batch, OnlineConfig, ReplayBuffer, StepBatch, TrainResult
from rlpipe.training.config import buffer_capacity, check_fractions, positive
from rlpipe.training.env import BOX
from rlpipe.training.model_based import (
    DYNAMICS_MODULE,
    MixedBatches,
    ModelFields,
    branched_rollout,
    buffer_contents,
    build_ensemble,
    fit_on,
    fits_metrics,
)
from rlpipe.training.offpolicy import Agent, OffPolicySetup, setup, train_off_policy
from rlpipe.training.planning import ModelEnv

ACTION_SPACES = (BOX,)
SPEC = REGISTRY["mbpo"]
MODEL_SEED_OFFSET = 2  # the model's fits and rollouts draw from their own stream (the buffers: seed, seed + 1)


@dataclass
class Config(ModelFields, SACFields, OnlineConfig):
    buffer_size: int = buffer_capacity(100_000)
    learning_starts: int = 250  # uniform random actions before this many env steps
    updates_per_step: float = 10.0  # SAC updates per env step (the text: 10)
    # The dynamics ensemble (see ModelFields): 7 members, 5 elites, the env's known reward
    # where it has one.
    members: int = positive(7)
    # Branched rollouts, at the paper's data settings (Janner et al. 2019, appendix C).
    model_train_every: int = positive(250)  # env steps between model refits (and rollouts)
    rollout_batch: int = positive(100_000)  # real start states per refit: 400 per env step
    # Rollout length: (from_step, to_step, from_length, to_length), linear in env steps in
    # between (the paper's schedule, in env steps instead of its 1000-step epochs). The
    # default is InvertedPendulum's, length 1 throughout; Hopper's is (20_000, 100_000, 1, 15).
    rollout_schedule: tuple[int, int, int, int] = (0, 15_000, 1, 1)
    model_retain: int = positive(4)  # refits whose rollouts the model buffer keeps (the paper: one epoch)
    real_ratio: float = 0.05  # share of real transitions per minibatch; 1.0 fits no model

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fractions(self, "real_ratio")
        schedule = self.rollout_schedule
        if not (len(schedule) == 4 and 0 <= schedule[0] < schedule[1] and min(schedule[2:]) >= 1):
            raise RlpipeError(
                f"setting rollout_schedule={list(self.rollout_schedule)}: expected [from_step, to_step, "
                "from_length, to_length] with from_step < to_step and lengths >= 1"
            )

    def rollout_length_at(self, env_steps: int) -> int:
        """The model rollouts' length after ``env_steps``: the schedule's linear ramp."""
        from_step, to_step, from_length, to_length = self.rollout_schedule
        progress = min(max((env_steps - from_step) / (to_step - from_step), 0.0), 1.0)
        return int(from_length + progress * (to_length - from_length))


TUNED: dict[str, dict[str, Any]] = {
    # The budget: -200 within 4k env steps (SAC needs about 10k here).
    "Pendulum-v1": dict(env_steps=4_000, hidden=(64, 64), actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3),
    # The MBPO reference's InvertedPendulum config (taken, not tuned here): target entropy
    # -0.05, model rollouts kept for one 250-step epoch, 500 random steps first. At SAC's
    # target entropy -1 and 4 refits kept, MBPO stayed near 100 after 3000 env steps
    # (docs/algorithms/model-based.md).
    "InvertedPendulum-v5": dict(env_steps=3_000, target_entropy=-0.05, model_retain=1, learning_starts=500),
    # The MBPO reference's Hopper config (target entropy -1, rollouts kept for one 1000-step
    # epoch = 4 refits, length 1 until 20k env steps and 15 at 150k, 5000 random steps
    # first) but 10 SAC updates per env step (its base config's; its Hopper config: 20) and
    # 20k env steps: the budget of a 2-core machine (~11 ms per update).
    "Hopper-v5": dict(
        env_steps=20_000,
        updates_per_step=10.0,
        target_entropy=-1.0,
        model_retain=4,
        rollout_schedule=(20_000, 150_000, 1, 15),
        learning_starts=5_000,
    ),
}


class ModelAugmentedReplay:
    """The replay interface of the off-policy loop over real and model transitions (with
    ``real_ratio`` 1.0 no minibatch reads the model's, so no model is fitted)."""

    def __init__(self, config: Config, env: OffPolicySetup, agent: Agent, generator: torch.Generator) -> None:
        self.config, self.agent, self.generator = config, agent, generator
        capacity = min(config.buffer_size, config.env_steps + config.num_envs)
        self.real = ReplayBuffer(capacity, env.obs_dim, env.act_dim, env.device, seed=config.seed)
        synthetic = config.model_retain * config.rollout_batch * max(config.rollout_schedule[2:])
        self.synthetic = ReplayBuffer(synthetic, env.obs_dim, env.act_dim, env.device, seed=config.seed + 1)
        self.model, self.optimizer = build_ensemble(config, env.obs_dim, env.act_dim, env.device)
        terminated, reward = termination_fn(SPEC.name, config.env_id), reward_fn(SPEC.name, config.env_id, config.reward)
        self.known_reward = reward is not None
        self.model_env = ModelEnv(self.model, cast(spaces.Box, env.action_space), terminated, reward, generator)  # ACTION_SPACES: a Box
        self.batches = MixedBatches(self.real.sample, self.synthetic, config.real_ratio)
        self.fits: list[FitReport] = []
        self.next_refit = config.learning_starts if config.real_ratio < 1.0 else float("inf")

    def __len__(self) -> int:
        return len(self.real)

    def store(self, step: StepBatch) -> None:
        self.real.store(step)
        if len(self.real) >= self.next_refit:
            self.refit_and_roll_out()
            self.next_refit += self.config.model_train_every

    def refit_and_roll_out(self) -> None:
        contents = buffer_contents(self.real)
        self.fits.append(fit_on(self.model, self.optimizer, contents, self.config, self.generator, known_reward=self.known_reward))
        start = self.real.sample(self.config.rollout_batch).obs
        policy = lambda obs: cast(TanhGaussianActor, self.agent.actor).sample(obs)[0]  # noqa: E731  # SAC's actor (make_agent)
        branched_rollout(self.model_env, policy, start, self.config.rollout_length_at(len(self.real)), self.synthetic)

    def sample(self, batch_size: int) -> Batch:
        return self.batches.sample(batch_size)


def train(config: Config, out_dir: str | Path | None = None, *, progress: bool = True) -> TrainResult:
    """Train MBPO; with ``out_dir`` also write checkpoint (policy, critics, dynamics),
    ``metrics.json`` (with every training episode's return) and the DVCLive curve."""
    env = setup(SPEC.name, config)
    agent = make_agent(config, env)
    replay = ModelAugmentedReplay(config, env, agent, torch.Generator(device=env.device).manual_seed(config.seed + MODEL_SEED_OFFSET))
    episodes = EpisodeReturns()
    sac_metrics = agent.extra_metrics
    assert sac_metrics is not None  # SAC's agent reports its temperature

    def extra_metrics() -> dict[str, Any]:
        return {**sac_metrics(), "episode_returns": episodes.returns, **fits_metrics(replay.fits)}

    agent = replace(agent, modules={**agent.modules, DYNAMICS_MODULE: replay.model}, extra_metrics=extra_metrics)
    return train_off_policy(SPEC.name, config, env, agent, out_dir, progress, episodes, replay)
