"""What the off-policy actor-critics (SAC, DDPG, TD3) share: env/device/seed setup and
the collect-store-update-evaluate loop. Each algorithm supplies only its networks, how it
explores and how it updates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlpipe.training.buffer import Batch, ReplayBuffer
from rlpipe.training.env import BOX, ActionScaler, make_vec_env, require_spaces, resolve_device
from rlpipe.training.evaluation import policy_fn
from rlpipe.training.rollout import StepSink, VecStepper
from rlpipe.training.run import Run, TrainResult
from rlpipe.training.seeding import seed_everything

Explore = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``explore(obs, episode_reset_mask) -> actions in [-1, 1]``."""
Update = Callable[[Batch, int], None]
"""``update(batch, update_index)``: one gradient update on a sampled minibatch."""


@dataclass
class OffPolicySetup:
    """Vector envs checked for a continuous action space, device, seeded RNG, sizes."""

    envs: gym.vector.VectorEnv
    action_space: spaces.Box
    obs_dim: int
    act_dim: int
    device: torch.device
    rng: np.random.Generator


def noisy_explore(actor: nn.Module, noise: Callable[[np.ndarray], np.ndarray], device: torch.device) -> Explore:
    """Exploration for deterministic actors (DDPG, TD3): clip(actor(obs) + noise, -1, 1)."""

    def explore(obs: np.ndarray, episode_reset: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        return np.clip(action + noise(episode_reset), -1.0, 1.0)

    return explore


def setup(algo: str, config: Any) -> OffPolicySetup:
    """Make ``config.num_envs`` envs, check spaces, resolve the device, seed everything."""
    envs = make_vec_env(config.env_id, config.num_envs)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    try:
        require_spaces(algo, config.env_id, obs_space, act_space, (BOX,))
        device = resolve_device(config.device)
    except Exception:
        envs.close()
        raise
    rng = seed_everything(config.seed, config.torch_threads)
    return OffPolicySetup(envs, act_space, obs_space.shape[0], act_space.shape[0], device, rng)


def train_off_policy(
    algo: str,
    config: Any,
    env: OffPolicySetup,
    actor: nn.Module,
    modules: dict[str, nn.Module],
    explore: Explore,
    update: Update,
    out_dir: str | Path | None,
    progress: bool,
    step_sink: StepSink | None,
    extra_metrics: Callable[[], dict[str, Any]] | None = None,
) -> TrainResult:
    """Collect, store, update and evaluate until ``config.env_steps``; save the run.

    Uniform random actions are used for the first ``config.learning_starts`` env steps;
    after that ``explore`` acts and ``update`` runs ``config.updates_per_step`` times per
    collected transition on ``config.batch_size`` samples. Reset steps of the NEXT_STEP
    autoreset (``valid`` False) are never stored. ``modules`` must include ``"policy"``.
    """
    scaler = ActionScaler(env.action_space)
    stepper = VecStepper(env.envs, scaler, config.seed, step_sink)
    buffer = ReplayBuffer(min(config.buffer_size, config.env_steps + config.num_envs), env.obs_dim, env.act_dim, env.device, seed=config.seed)
    eval_policy = policy_fn(actor, scaler, env.device)
    run = Run(algo, config, out_dir, progress)
    updates, credit = 0, 0.0
    try:
        while True:
            if stepper.env_steps < config.learning_starts:
                actions = env.rng.uniform(-1.0, 1.0, (stepper.num_envs, env.act_dim))
            else:
                actions = explore(stepper.obs, ~stepper.valid)
            b = stepper.step(actions)
            v = b.valid
            buffer.add(b.obs[v], b.actions[v], b.rewards[v], b.next_obs[v], b.terminated[v])
            if stepper.env_steps > config.learning_starts:  # credit only post-warm-up transitions
                credit += min(int(v.sum()), stepper.env_steps - config.learning_starts) * config.updates_per_step
                while credit >= 1.0:
                    update(buffer.sample(config.batch_size), updates)
                    updates += 1
                    credit -= 1.0
            run.show(stepper.env_steps, stepper.last_return)
            if run.maybe_evaluate(eval_policy, stepper.env_steps):
                break
        extra = {"train_episodes": stepper.episodes, **(extra_metrics() if extra_metrics else {})}
        return run.finish(eval_policy, actor, modules, env.action_space, stepper.env_steps, updates, extra)
    finally:
        run.close()
        env.envs.close()
