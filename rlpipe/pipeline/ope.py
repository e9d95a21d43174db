"""Off-policy evaluation: Fitted Q Evaluation (FQE, Le et al. 2019; d3rlpy's `FQE`).

FQE estimates what a trained policy would score from a dataset alone, without the env:
it fits Q^pi by regression on the dataset's transitions towards
``r + gamma * (1 - terminated) * Q_target(s', pi(s'))`` (time-limit truncations bootstrap),
copying the target network every ``target_every`` updates, and reports the mean of
``Q(s0, pi(s0))`` over the dataset's initial states: the policy's discounted return from
the data's start distribution. The policy is deterministic, so pi(s') is computed once for
every row. Rewards are scaled by ``(1 - gamma) / max|r|`` while fitting (values of order 1,
whatever the env's reward scale) and the estimate is scaled back.

Use it to rank checkpoints or algorithms when evaluating in the env is expensive or
impossible; its absolute values carry the regression's bias, its ranking is what it is for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.algos.policy import LoadedPolicy
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.envs.goals import flatten_obs
from rlpipe.envs.spaces import ActionScaler
from rlpipe.errors import RlpipeError
from rlpipe.models.networks import mlp


_CHUNK = 65536  # observations per policy call


@dataclass(frozen=True)
class FQEConfig:
    """FQE's settings (d3rlpy's FQE defaults, except the batch and the updates)."""

    gamma: float = 0.99
    updates: int = 20_000
    batch_size: int = 256
    hidden: tuple[int, ...] = (256, 256)
    learning_rate: float = 1e-4
    target_every: int = 100  # hard copy of the Q-network into the target network
    seed: int = 0

    def check(self) -> None:
        if not 0 <= self.gamma < 1:
            raise RlpipeError(f"gamma must be in [0, 1), got {self.gamma}")
        for name in ("updates", "batch_size", "target_every"):
            if getattr(self, name) < 1:
                raise RlpipeError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise RlpipeError(f"learning_rate must be > 0, got {self.learning_rate}")


@dataclass(frozen=True)
class FQEResult:
    """The estimate (discounted return from the data's initial states) and its standard error
    over those states."""

    estimate: float
    standard_error: float
    initial_states: int
    config: dict[str, Any]


def _policy_inputs(policy: LoadedPolicy, obs: Columnar) -> tuple[np.ndarray, np.ndarray]:
    """(flat observations, the policy's env actions) for a column of observations, in chunks."""
    flat = flatten_obs(obs).astype(np.float32)
    chunks = [policy(map_columnar(obs, lambda a, i=i: np.asarray(a)[i:i + _CHUNK])) for i in range(0, len(flat), _CHUNK)]
    return flat, np.concatenate(chunks)


def fitted_q_evaluation(policy: LoadedPolicy, data: TransitionArrays, config: FQEConfig = FQEConfig()) -> FQEResult:
    """Estimate `policy`'s discounted return from `data` (module doc)."""
    config.check()
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    space = policy.action_space
    discrete = isinstance(space, spaces.Discrete)
    scaler = ActionScaler(space)
    obs = flatten_obs(data.obs).astype(np.float32)
    next_obs, next_actions = _policy_inputs(policy, data.next_obs)
    initial = np.flatnonzero(np.asarray(data.step) == 0)
    if len(initial) == 0:
        raise RlpipeError("the dataset holds no initial states (step 0): FQE estimates the return from them")
    first_obs, first_actions = _policy_inputs(policy, map_columnar(data.obs, lambda a: np.asarray(a)[initial]))

    def encode(actions: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(scaler.from_env(actions), dtype=torch.int64 if discrete else torch.float32)

    rewards = np.asarray(data.reward, np.float64)
    reward_scale = float(np.abs(rewards).max()) / (1 - config.gamma) or 1.0
    columns = {
        "obs": torch.as_tensor(obs), "actions": encode(np.asarray(data.action)),
        "rewards": torch.as_tensor(rewards / reward_scale, dtype=torch.float32),
        "next_obs": torch.as_tensor(next_obs), "next_actions": encode(next_actions),
        "alive": torch.as_tensor(1.0 - np.asarray(data.terminated, np.float32)),
    }
    obs_dim = obs.shape[1]
    out_dim = int(space.n) if discrete else 1
    q_net = mlp(obs_dim + (0 if discrete else int(np.prod(space.shape))), out_dim, config.hidden)
    target = mlp(obs_dim + (0 if discrete else int(np.prod(space.shape))), out_dim, config.hidden)
    target.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)

    def q_value(net: torch.nn.Module, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if discrete:
            return net(states).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return net(torch.cat([states, actions.reshape(len(actions), -1)], dim=-1)).squeeze(-1)

    for update in range(config.updates):
        index = torch.randint(len(rewards), (config.batch_size,), generator=generator)
        batch = {name: column[index] for name, column in columns.items()}
        with torch.no_grad():
            bootstrap = q_value(target, batch["next_obs"], batch["next_actions"])
            y = batch["rewards"] + config.gamma * batch["alive"] * bootstrap
        loss = torch.nn.functional.mse_loss(q_value(q_net, batch["obs"], batch["actions"]), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (update + 1) % config.target_every == 0:
            target.load_state_dict(q_net.state_dict())

    with torch.no_grad():
        values = q_value(q_net, torch.as_tensor(first_obs), encode(first_actions)).numpy().astype(np.float64) * reward_scale
    standard_error = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return FQEResult(float(values.mean()), standard_error, len(values), asdict(config))


__all__ = ["FQEConfig", "FQEResult", "fitted_q_evaluation"]
