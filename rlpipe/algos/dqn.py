"""DQN: a Q-network over discrete actions learnt from replay, with the double-DQN target
(van Hasselt et al. 2016), an optional dueling head (Wang et al. 2016), epsilon-greedy
exploration decaying linearly, and a target network copied every ``target_update_every``
updates (``tau`` < 1: averaged into it instead).

Read top to bottom: config and tuned defaults, the schedule and the target (``epsilon``,
``greedy_next``, ``td_target``, shared with QR-DQN in ``qrdqn.py``, whose network outputs
return quantiles where DQN's outputs one value), ``make_agent``: the network, its update
and exploration, then ``train``: the shared off-policy loop (rlpipe.training.offpolicy)
that collects transitions (optionally streaming every one of them to ``step_sink``).

Observations are flat vectors or images (MinAtar's 10 x 10 x C boards, Atari frames): the
network's encoder (rlpipe.nets.encoders) is chosen from the observation space.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlpipe.algos.registry import REGISTRY
from rlpipe.nets.encoders import EncoderChoice
from rlpipe.nets.networks import GreedyQPolicy
from rlpipe.training import Batch, OnlineConfig, StepSink, TrainResult
from rlpipe.training.config import buffer_capacity, check_fractions, layer_sizes, positive
from rlpipe.training.diagnostics import Diagnosed
from rlpipe.training.env import BOX, DISCRETE, IMAGE, encoder_spec
from rlpipe.training.losses import of_actions
from rlpipe.training.offpolicy import Agent, OffPolicySetup, setup, train_off_policy
from rlpipe.training.optim import adam, optimizer_step, polyak_update, target_copy

ACTION_SPACES = (DISCRETE,)
OBSERVATION_KINDS = (BOX, IMAGE)
SPEC = REGISTRY["dqn"]


@dataclass
class Config(OnlineConfig):
    env_steps: int = positive(100_000)
    eval_every: int = positive(5_000)
    buffer_size: int = buffer_capacity(100_000)
    learning_starts: int = 1_000  # uniform random actions (and no updates) before this many env steps
    updates_per_step: float = positive(1.0)  # gradient updates per collected transition (0.25: one every 4 steps)
    batch_size: int = positive(32)
    gamma: float = 0.99
    learning_rate: float = positive(1e-4)  # Adam
    max_grad_norm: float = positive(10.0)  # as SB3's DQN
    target_update_every: int = positive(1_000)  # gradient updates between target network updates
    tau: float = 1.0  # 1: the target network is a copy; < 1: it moves this far towards the online one
    double_q: bool = True  # the online network picks the next action, the target network values it
    dueling: bool = False
    exploration_start: float = 1.0  # epsilon at env step 0 ...
    exploration_end: float = 0.05  # ... decaying linearly to this ...
    exploration_steps: int = positive(10_000)  # ... over this many env steps
    hidden: tuple[int, ...] = layer_sizes((256, 256))  # MLP layers after the encoder
    encoder: EncoderChoice = "auto"  # the CNN that reads images; auto: by frame size
    frame_stack: int = positive(1)  # observations the network reads per decision (Atari: 4); the replay stores both stacks of a transition

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fractions(self, "exploration_start", "exploration_end", "tau")


TUNED: dict[str, dict[str, Any]] = {
    # rl-zoo's CartPole QR-DQN settings: batch 64, lr 2.3e-3, 256 x 256, epsilon 1 -> 0.04
    # over the first 8k steps, half an update per step with the target copied every 128
    # updates (the zoo: blocks of 128 updates every 256 steps, the target copied between
    # them). With lr 1e-3, 128 x 128, the target every 250 updates, seed 1 was at 194 after 50k steps.
    # The run stops at the first evaluation of 475 or more (seeds 0-4: by 22.5-32.5k steps):
    # run on to 50k, DQN's CartPole collapses again (seeds 0, 1 ended at 38 and 98).
    "CartPole-v1": dict(
        env_steps=50_000,
        eval_every=2_500,
        stop_at_return=475.0,
        learning_rate=2.3e-3,
        batch_size=64,
        learning_starts=1_000,
        updates_per_step=0.5,
        target_update_every=128,
        exploration_end=0.04,
        exploration_steps=8_000,
    ),
    # The MinAtar paper's DQN (Young & Tian 2019) scaled for a CPU: batch 32, 100k replay,
    # target copied every 1000 updates, epsilon 1 -> 0.1 over 100k frames, one update per
    # frame; Adam at RMSProp's 2.5e-4; one conv layer (the encoder) then 128 units. 100k
    # frames take ~9 CPU-minutes; the results are on docs/algorithms/online.md.
    "MinAtar/Breakout-v1": dict(
        env_steps=100_000,
        eval_every=10_000,
        buffer_size=100_000,
        learning_starts=5_000,
        batch_size=32,
        learning_rate=2.5e-4,
        target_update_every=1_000,
        exploration_end=0.1,
        exploration_steps=100_000,
        hidden=(128,),
    ),
}

# CartPole with the velocities hidden: CartPole's settings, the network reading the last 4
# observations (with one, the best evaluations stay near 50; docs/algorithms/online.md).
TUNED["rlpipe/CartPoleNoVel-v1"] = dict(TUNED["CartPole-v1"], frame_stack=4)

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(taken [B, atoms], target [B, atoms]) -> scalar``: DQN's Huber loss, QR-DQN's quantile Huber loss."""


def epsilon(config: Config, env_steps: int) -> float:
    """The exploration rate after ``env_steps``: linear from ``exploration_start`` to
    ``exploration_end`` over the first ``exploration_steps``, then constant."""
    progress = min(env_steps / config.exploration_steps, 1.0)
    return config.exploration_start + progress * (config.exploration_end - config.exploration_start)


@torch.no_grad()
def greedy_next(q: GreedyQPolicy, q_target: GreedyQPolicy, next_obs: torch.Tensor, double_q: bool) -> torch.Tensor:
    """The target network's outputs [B, atoms] at ``next_obs`` for the greedy next action:
    picked by the online network (double Q: its own errors are not what picks and values
    the action) or by the target network itself (DQN's max)."""
    target_out = q_target.quantile_values(next_obs)
    chooser = q(next_obs) if double_q else target_out.mean(-1)
    return of_actions(target_out, chooser.argmax(-1))


def td_target(q: GreedyQPolicy, q_target: GreedyQPolicy, b: Batch, gamma: float, double_q: bool) -> torch.Tensor:
    """r + gamma * (1 - terminated) * Q'(s', a*) for each output atom, [B, atoms]."""
    next_values = greedy_next(q, q_target, b.next_obs, double_q)
    return b.rewards.unsqueeze(-1) + gamma * (1.0 - b.terminated.unsqueeze(-1)) * next_values


def huber_loss(taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DQN's loss: Huber (quadratic within 1 of the target, linear beyond) of the TD error."""
    return F.smooth_l1_loss(taken, target)


def make_agent(config: Config, env: OffPolicySetup, loss: Loss = huber_loss, quantiles: int = 0) -> Agent:
    """The Q-network (``quantiles`` > 0: QR-DQN's), its target and Adam, the update on
    ``loss`` and epsilon-greedy exploration, for ``env``'s spaces and device."""
    obs_space = env.envs.single_observation_space
    encoder = encoder_spec(obs_space, config.frame_stack, config.encoder)
    q = GreedyQPolicy(env.obs_dim, env.act_dim, config.hidden, encoder, config.dueling, quantiles).to(env.device)
    q_target = target_copy(q)
    optimizer = adam(q.parameters(), config.learning_rate)

    def update(b: Batch, i: int) -> Diagnosed:
        target = td_target(q, q_target, b, config.gamma, config.double_q)
        taken = of_actions(q.quantile_values(b.obs), b.actions)
        td_loss = loss(taken, target)
        optimizer_step(optimizer, td_loss, config.max_grad_norm)
        if (i + 1) % config.target_update_every == 0:
            polyak_update(q_target, q, config.tau)
        return {"td_loss": td_loss.detach(), "q_mean": taken.detach().mean()}

    def explore(obs: np.ndarray, _: np.ndarray, env_steps: int) -> np.ndarray:
        greedy = q.act(torch.as_tensor(obs, dtype=torch.float32, device=env.device)).cpu().numpy()
        random = env.rng.integers(0, env.act_dim, len(obs))
        return np.where(env.rng.random(len(obs)) < epsilon(config, env_steps), random, greedy)

    return Agent(q, {"policy": q, "q_target": q_target}, explore, update, resume_state={"optimizer": optimizer})


def train(
    config: Config,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    step_sink: StepSink | None = None,
) -> TrainResult:
    """Train DQN; with ``out_dir`` also write checkpoint, ``metrics.json`` and DVCLive curve.

    ``step_sink`` is called after every vector-env step, as in :func:`rlpipe.algos.sac.train`.
    """
    env = setup(SPEC.name, config, OBSERVATION_KINDS, ACTION_SPACES)
    return train_off_policy(SPEC.name, config, env, make_agent(config, env), out_dir, progress, step_sink)
