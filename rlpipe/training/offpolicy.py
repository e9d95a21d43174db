"""What the off-policy learners (SAC, DDPG, TD3, HER on top of them, DQN and QR-DQN) share:
env/device/seed setup and the collect-store-update-evaluate loop. Each algorithm supplies
only an :class:`Agent`: its networks, how it explores and how it updates.

Continuous actions are stored in [-1, 1]; Discrete actions (DQN) as int64 indices.
Image observations are stored in their own dtype (bool, uint8), flat. With frame stacks
(DQN's ``frame_stack`` k > 1) the loop stacks each env's last k observations
(:class:`FrameStacks`, as policies do when they are evaluated) and the replay stores each
transition's two stacks, so the envs, and datasets streamed from the run, keep one frame a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlpipe.envs.goals import flat_observation_space, flatten_obs
from rlpipe.envs.spaces import is_image_space
from rlpipe.envs.stepper import StepBatch, StepSink, VecStepper
from rlpipe.errors import RlpipeError
from rlpipe.training.buffer import Batch, ReplayBuffer, Update
from rlpipe.training.config import OnlineConfig
from rlpipe.training.env import BOX, ActionScaler, action_dim, make_vec_env, require_spaces, resolve_device
from rlpipe.training.evaluation import FrameStacks, policy_fn
from rlpipe.training.optim import mixed_precision
from rlpipe.training.resume import Checkpointer
from rlpipe.training.run import Run, TrainResult
from rlpipe.training.seeding import seed_everything

Explore = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
"""``explore(obs, episode_reset_mask, env_steps) -> actions`` in [-1, 1] (Discrete: indices);
``env_steps`` (collected so far) drives schedules such as DQN's epsilon."""


class Replay(Protocol):
    """A replay buffer the loop can fill and sample (ReplayBuffer, HER's episode buffer)."""

    def __len__(self) -> int: ...

    def store(self, step: StepBatch) -> None: ...

    def sample(self, batch_size: int) -> Batch: ...


@runtime_checkable
class OffPolicyConfig(Protocol):
    """What the off-policy loop reads of a config beyond `OnlineConfig`'s budget and seed: the
    replay fields, which each algorithm declares (with its own defaults) among its fields."""

    seed: int
    env_steps: int
    num_envs: int
    batch_size: int
    buffer_size: int
    learning_starts: int  # uniform random actions, and no updates, before this many env steps
    updates_per_step: float  # gradient updates per collected transition


def require_off_policy_config(algo: str, config: OnlineConfig) -> OffPolicyConfig:
    """``config``, which must declare the replay fields of `OffPolicyConfig`."""
    if not isinstance(config, OffPolicyConfig):
        raise RlpipeError(f"{algo}'s config needs batch_size, buffer_size, learning_starts and updates_per_step for the off-policy loop")
    return config


@dataclass
class Agent:
    """What an off-policy algorithm brings to the loop (built by its ``make_agent``)."""

    actor: nn.Module  # the policy that is evaluated and checkpointed as "policy"
    modules: dict[str, nn.Module]  # everything checkpointed, including "policy"
    explore: Explore
    update: Update
    extra_metrics: Callable[[], dict[str, Any]] | None = None
    # What a resumed run needs beyond ``modules`` (optimisers, a temperature module), in the
    # forms rlpipe.training.resume saves; None: the agent cannot resume (--checkpoint-every refused).
    resume_state: dict[str, Any] | None = None


@dataclass
class OffPolicySetup:
    """Vector envs checked for the algorithm's action and observation spaces, device, seeded RNG, sizes.

    ``obs_dim`` is the number of values the networks see (goal Dicts flattened, see
    rlpipe.envs.goals; an image's pixels; times ``frame_stack``, the observations stacked per
    decision), ``obs_dtype`` the dtype they are stored in (float32; an image's own bool or
    uint8). ``act_dim``: action dimensions (Box) or the number of actions (Discrete).
    """

    envs: gym.vector.VectorEnv
    action_space: spaces.Space
    obs_dim: int
    act_dim: int
    device: torch.device
    rng: np.random.Generator
    obs_dtype: torch.dtype = torch.float32
    frame_stack: int = 1

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, spaces.Discrete)


def noisy_explore(actor: nn.Module, noise: Callable[[np.ndarray], np.ndarray], device: torch.device) -> Explore:
    """Exploration for deterministic actors (DDPG, TD3): clip(actor(obs) + noise, -1, 1)."""

    def explore(obs: np.ndarray, episode_reset: np.ndarray, _: int) -> np.ndarray:
        with torch.no_grad():
            action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        return np.clip(action + noise(episode_reset), -1.0, 1.0)

    return explore


def setup(algo: str, config: OnlineConfig, observations: tuple[str, ...] = (BOX,), actions: tuple[str, ...] = (BOX,)) -> OffPolicySetup:
    """Make ``config.num_envs`` envs, check spaces (``observations`` and ``actions``: accepted
    kinds, see :func:`require_spaces`), resolve the device, seed everything. The networks
    read ``config.frame_stack`` observations a decision (1 where the config has no such field)."""
    envs = make_vec_env(config.env_id, config.num_envs)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    try:
        require_spaces(algo, config.env_id, obs_space, act_space, actions, observations)
        device = resolve_device(config.device)
    except Exception:
        envs.close()
        raise
    rng = seed_everything(config.seed, config.torch_threads)
    flat = flat_observation_space(obs_space)
    obs_dtype = torch.from_numpy(np.empty(0, flat.dtype)).dtype if is_image_space(flat) else torch.float32
    frame_stack = getattr(config, "frame_stack", 1)  # only algorithms whose config declares it (DQN, QR-DQN) stack
    obs_dim = frame_stack * int(np.prod(flat.shape))
    return OffPolicySetup(envs, act_space, obs_dim, action_dim(act_space), device, rng, obs_dtype, frame_stack)


def run_replay_buffer(config: OffPolicyConfig, env: OffPolicySetup) -> ReplayBuffer:
    """A run's plain replay buffer: ``config.buffer_size`` rows, capped at what the run can fill."""
    capacity = min(config.buffer_size, config.env_steps + config.num_envs)
    act_dim, action_dtype = (1, torch.int64) if env.discrete else (env.act_dim, torch.float32)
    return ReplayBuffer(capacity, env.obs_dim, act_dim, env.device, config.seed, obs_dtype=env.obs_dtype, action_dtype=action_dtype)


def warmup_actions(env: OffPolicySetup, num_envs: int) -> np.ndarray:
    """Uniform random actions, in [-1, 1] or Discrete indices, from the run's generator (before ``learning_starts``)."""
    if env.discrete:
        return env.rng.integers(0, env.act_dim, num_envs)
    return env.rng.uniform(-1.0, 1.0, (num_envs, env.act_dim))


def with_frame_stacks(step: StepBatch, stacks: np.ndarray) -> StepBatch:
    """``step`` with the stacks the policy read as its observations and, as its next
    observations, those stacks moved on by the next frame: the transitions the replay stores
    (a reset step's rows, never stored, are left inconsistent)."""
    next_stacks = np.concatenate([stacks[:, 1:], flatten_obs(step.next_obs)[:, None]], axis=1)
    return replace(step, obs=stacks, next_obs=next_stacks)


def earned_updates(config: OffPolicyConfig, stepper: VecStepper, b: StepBatch) -> float:
    """The updates step ``b`` earns: ``config.updates_per_step`` per valid transition
    collected after ``config.learning_starts`` env steps."""
    if stepper.env_steps <= config.learning_starts:
        return 0.0
    return min(int(b.valid.sum()), stepper.env_steps - config.learning_starts) * config.updates_per_step


def train_off_policy(
    algo: str,
    config: OnlineConfig,
    env: OffPolicySetup,
    agent: Agent,
    out_dir: str | Path | None,
    progress: bool,
    step_sink: StepSink | None,
    buffer: Replay | None = None,
) -> TrainResult:
    """Collect, store, update and evaluate until ``config.env_steps``; save the run.

    Uniform random actions are used for the first ``config.learning_starts`` env steps;
    after that ``agent.explore`` acts and, once ``buffer`` can be sampled, ``agent.update``
    runs ``config.updates_per_step`` times per collected transition on ``config.batch_size``
    samples. ``buffer`` defaults to a plain :class:`ReplayBuffer`; reset steps of the
    NEXT_STEP autoreset (``valid`` False) are never stored. With ``env.frame_stack`` k > 1
    the agent acts on, and the buffer stores, each env's last k observations. With
    ``config.checkpoint_every`` the full state (agent, buffer, envs, frame stacks, RNGs,
    counters) is saved for resuming (:mod:`rlpipe.training.resume`).
    """
    replay = require_off_policy_config(algo, config)
    scaler = ActionScaler(env.action_space)
    stepper = VecStepper(env.envs, scaler, config.seed, step_sink)
    if buffer is None:
        buffer = run_replay_buffer(replay, env)
    if config.checkpoint_every is not None and (agent.resume_state is None or not hasattr(buffer, "state_dict")):
        env.envs.close()
        raise RlpipeError(f"{algo} does not support --checkpoint-every yet")
    eval_policy = policy_fn(agent.actor, scaler, env.device, deterministic=not config.eval_sampled_actions)
    update = mixed_precision(agent.update, config.precision, env.device)
    run = Run(algo, config, out_dir, progress)
    frames = FrameStacks(env.frame_stack) if env.frame_stack > 1 else None
    loop_state = {"buffer": buffer, "stepper": stepper, "rng": env.rng, **({"frames": frames} if frames is not None else {})}
    checkpoints = Checkpointer(run, {**agent.modules, **(agent.resume_state or {}), **loop_state})
    try:
        loop = checkpoints.restore() or {"updates": 0, "credit": 0.0}
        updates, credit = loop["updates"], loop["credit"]
        while True:
            obs = flatten_obs(stepper.obs)
            if frames is not None:
                obs = frames.push(obs)  # [envs, k, *frame], pushed at every step, warm-up included
            if stepper.env_steps < replay.learning_starts:
                actions = warmup_actions(env, stepper.num_envs)
            else:
                actions = agent.explore(obs, ~stepper.valid, stepper.env_steps)
            b = stepper.step(actions)
            if frames is not None:
                frames.start(~b.valid)  # after a reset step, an env's next observation starts its episode
                b = with_frame_stacks(b, obs)
            buffer.store(b)
            # Credit only post-warm-up transitions, and only once the buffer can be sampled
            # (HER's holds completed episodes only).
            if len(buffer):
                credit += earned_updates(replay, stepper, b)
                while credit >= 1.0:
                    run.diagnostics.add(update(buffer.sample(replay.batch_size), updates))
                    updates += 1
                    credit -= 1.0
            run.show(stepper.env_steps, stepper.last_return)
            if run.maybe_evaluate(eval_policy, stepper.env_steps):
                break
            checkpoints.maybe_save(stepper.env_steps, {"updates": updates, "credit": credit})
        extra = {"train_episodes": stepper.episodes, **(agent.extra_metrics() if agent.extra_metrics else {})}
        result = run.finish(eval_policy, agent.actor, agent.modules, env.action_space, stepper.env_steps, updates, extra)
        checkpoints.discard()
        return result
    finally:
        run.close()
        env.envs.close()
