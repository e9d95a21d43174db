"""Planning and rollouts in a learned dynamics ensemble: :class:`ModelEnv` (the ensemble
plus the env's known termination and, optionally, reward) and :class:`CEMPlanner`, the
cross-entropy-method MPC of PETS.

The planner evaluates population x particles candidate rollouts of every env in the batch
as ONE batched computation per horizon step: the rows are split at random into equal
groups, one per elite member, and each row stays with its member for the whole horizon
(trajectory sampling TS-inf, Chua et al. 2018). Each member's group is one ``baddbmm``
operand, so the whole step is a few large matmuls regardless of the number of members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.errors import RlpipeError
from rlpipe.nets.dynamics import GaussianEnsemble, Layers
from rlpipe.nets.env_fns import EnvFn
from rlpipe.training.config import positive
from rlpipe.training.env import ActionScaler
from rlpipe.training.evaluation import PolicyFn


class ModelEnv:
    """A dynamics ensemble stepped like a batched env, actions in the policy's [-1, 1].

    ``reward`` is the env's known reward function (None: the model's learned reward);
    ``terminated`` its known termination function.
    """

    def __init__(
        self,
        model: GaussianEnsemble,
        action_space: spaces.Box,
        terminated: EnvFn,
        reward: EnvFn | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model, self.terminated_fn, self.reward_fn, self.generator = model, terminated, reward, generator
        device = next(model.parameters()).device
        low, high = (torch.as_tensor(np.asarray(b, np.float32), device=device) for b in (action_space.low, action_space.high))
        self.action_offset, self.action_scale = (high + low) / 2, (high - low) / 2

    def to_env(self, actions: torch.Tensor) -> torch.Tensor:
        return self.action_offset + self.action_scale * actions

    def step(
        self, obs: torch.Tensor, actions: torch.Tensor, layers: Layers | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows [K, N, .] of K members (``layers``, default all) -> sampled next obs, reward
        and terminated flags."""
        next_obs, reward = self.model.sample(obs, actions, layers, self.generator)
        env_actions = self.to_env(actions)
        if self.reward_fn is not None:
            reward = self.reward_fn(obs, env_actions, next_obs)
        return next_obs, reward, self.terminated_fn(obs, env_actions, next_obs)

    def returns(self, obs: torch.Tensor, actions: torch.Tensor, layers: Layers) -> torch.Tensor:
        """Undiscounted returns [K, N] of action sequences [K, N, H, a] from obs [K, N, o]
        (nothing accrues after a termination)."""
        total = torch.zeros(obs.shape[:2], device=obs.device)
        alive = torch.ones_like(total)
        for t in range(actions.shape[2]):
            obs, reward, terminated = self.step(obs, actions[:, :, t], layers)
            total += alive * reward
            alive = alive * (~terminated).float()
        return total

    def branch(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One model step from a batch [N, .] for rollouts (MBPO, MOPO): every member
        predicts every row, each row draws its next obs and reward from a random elite.
        Also returns each row's uncertainty, max over members of ||std|| over the outputs
        the rollout reads (MOPO's penalty; Δobs only where the known reward replaces the
        model's)."""
        mean, std = self.model(obs, actions)
        pick = cast(torch.Tensor, self.model.elites)[
            torch.randint(0, self.model.num_elites, (len(obs),), generator=self.generator, device=obs.device)
        ]
        rows = torch.arange(len(obs), device=obs.device)
        draw = mean[pick, rows] + std[pick, rows] * torch.randn(mean.shape[1:], generator=self.generator, device=obs.device)
        next_obs, reward = obs + draw[:, :-1], draw[:, -1]
        env_actions = self.to_env(actions)
        if self.reward_fn is not None:
            reward = self.reward_fn(obs, env_actions, next_obs)
        read = std if self.reward_fn is None else std[..., :-1]
        return next_obs, reward, self.terminated_fn(obs, env_actions, next_obs), read.norm(dim=-1).max(0).values


@dataclass
class CEMSettings:
    """Cross-entropy-method MPC, standalone or as a run config's fields (PETS, the dynamics
    trainer's evaluation). ``particles`` rollouts per candidate sequence, each fixed to a
    random elite member; the sampling std starts at ``init_std`` (policy units) each step
    and the mean and std move by (1 - ``smoothing``) towards the elites' each iteration.
    The paper's planner (PETS, mbrl-lib) is ``population=400 particles=20``; the defaults,
    50 x 1, cost 45-90x less CPU per planning step (docs/benchmarks.md)."""

    horizon: int = positive(25)
    population: int = positive(50)
    elite_fraction: float = 0.2
    iterations: int = positive(5)
    particles: int = positive(1)
    init_std: float = positive(0.5)
    smoothing: float = 0.1

    def check_planning(self, members: int) -> None:
        """An RlpipeError for settings that cannot plan with ``members`` elite members."""
        if min(self.horizon, self.population, self.iterations, self.particles) < 1:
            raise RlpipeError("planning horizon, population, iterations and particles must all be >= 1")
        if not 0.0 < self.elite_fraction <= 1.0:
            raise RlpipeError(f"elite_fraction must be in (0, 1], got {self.elite_fraction}")
        if (self.population * self.particles) % members:
            raise RlpipeError(
                f"population x particles ({self.population} x {self.particles}) must be a multiple of the "
                f"{members} elite members (each member takes an equal share of the rollouts)"
            )


class CEMPlanner:
    """Plans the next action of a batch of envs by CEM over action sequences in ``env``,
    warm-started from each env's previous plan shifted by one step. The plan is kept
    per batch row; a batch of another size starts afresh, and :meth:`reset` drops the
    warm start of the rows whose env starts a new episode."""

    def __init__(self, env: ModelEnv, settings: CEMSettings, act_dim: int, generator: torch.Generator | None = None) -> None:
        settings.check_planning(env.model.num_elites)
        self.env, self.s, self.act_dim, self.generator = env, settings, act_dim, generator
        self.num_elites = max(1, round(settings.elite_fraction * settings.population))
        self.plan: torch.Tensor | None = None

    def reset(self, rows: np.ndarray | None = None) -> None:
        """Plan the next step of the envs at ``rows`` (a mask; None: all) afresh."""
        if rows is None or self.plan is None or len(rows) != self.plan.shape[0]:  # another batch starts afresh anyway
            self.plan = None
        elif rows.any():
            self.plan[torch.as_tensor(rows, device=self.plan.device)] = 0.0  # a zero plan is a fresh start

    def _initial_mean(self, batch: int, device: torch.device) -> torch.Tensor:
        zeros = torch.zeros(batch, self.s.horizon, self.act_dim, device=device)
        if self.plan is None or self.plan.shape[0] != batch:
            return zeros
        return torch.cat([self.plan[:, 1:], zeros[:, :1]], dim=1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations [B, o] -> the first action [B, a] of each env's planned sequence."""
        s, (batch, device) = self.s, (obs.shape[0], obs.device)
        model = self.env.model
        members = None if model.num_elites == model.members else cast(torch.Tensor, model.elites)  # a registered buffer
        layers = model.member_layers(members)
        k = layers[0][0].shape[0]
        rows = batch * s.population * s.particles
        # Row r = (env, candidate, particle); TS-inf: a random equal split of rows over members.
        groups = torch.randperm(rows, generator=self.generator, device=device).view(k, rows // k)
        start = obs.repeat_interleave(s.population * s.particles, 0)[groups]
        mean = self._initial_mean(batch, device)
        std = torch.full_like(mean, s.init_std)
        shape = (batch, s.population, s.horizon, self.act_dim)
        for _ in range(s.iterations):
            noise = torch.randn(shape, generator=self.generator, device=device)
            candidates = (mean.unsqueeze(1) + std.unsqueeze(1) * noise).clamp_(-1.0, 1.0)
            per_row = candidates.unsqueeze(2).expand(-1, -1, s.particles, -1, -1).reshape(rows, s.horizon, self.act_dim)
            returns = torch.empty(rows, device=device)
            returns[groups.reshape(-1)] = self.env.returns(start, per_row[groups], layers).reshape(-1)
            value = returns.view(batch, s.population, s.particles).mean(-1).nan_to_num(nan=-torch.inf)
            best = value.topk(self.num_elites, dim=1).indices
            elites = candidates.gather(1, best[:, :, None, None].expand(-1, -1, s.horizon, self.act_dim))
            mean = s.smoothing * mean + (1 - s.smoothing) * elites.mean(1)
            std = s.smoothing * std + (1 - s.smoothing) * elites.std(1, unbiased=False)
        self.plan = mean
        return mean[:, 0]


@dataclass
class PlannerPolicy:
    """A planner as an episodic policy function (see :class:`rlpipe.training.evaluation.EpisodicPolicy`):
    a batch of observations -> env-scaled actions, its warm start dropped per new episode."""

    planner: CEMPlanner
    scaler: ActionScaler
    device: torch.device

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        actions = self.planner.act(torch.as_tensor(np.asarray(obs, np.float32), device=self.device))
        return self.scaler.to_env(actions.cpu().numpy())

    def start_episodes(self, rows: np.ndarray) -> None:
        self.planner.reset(rows)


def planner_policy(planner: CEMPlanner, scaler: ActionScaler, device: torch.device) -> PolicyFn:
    """A planner as a policy function: a batch of observations -> env-scaled actions."""
    return PlannerPolicy(planner, scaler, device)
