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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.datasets.frames import chain_starts, stack_depths, stacked, stacked_next
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.envs.goals import flatten_obs
from rlpipe.envs.spaces import ActionScaler
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_UPDATES
from rlpipe.nets.networks import EnsembleMLP


class ActingPolicy(Protocol):
    """What FQE evaluates: a batch of observations to env actions (a saved run's
    `rlpipe.algos.policy.LoadedPolicy`, or an actor's copy during training)."""

    @property
    def action_space(self) -> spaces.Space: ...

    @property
    def frame_stack(self) -> int: ...

    def __call__(self, obs: np.ndarray) -> np.ndarray: ...


_CHUNK = 65536  # observations per policy call


@dataclass(frozen=True)
class FQEConfig:
    """FQE's settings. d3rlpy's FQE uses lr 1e-4 and a target copy every 100 updates; at
    15k updates those propagate values over too few steps of a 0.99-discounted horizon, and
    on Pendulum eight policies' estimates came out nearly equal. With lr 1e-3 and a copy every
    50 updates the estimates ranked them as their true returns do (Spearman 1.0)."""

    gamma: float = 0.99
    updates: int = 15_000
    batch_size: int = 256
    hidden: tuple[int, ...] = (64, 64)
    learning_rate: float = 1e-3
    target_every: int = 50  # hard copy of the Q-networks into the target networks
    seed: int = 0

    def check(self) -> None:
        if not 0 <= self.gamma < 1:
            raise RlpipeError(f"gamma must be in [0, 1), got {self.gamma}")
        for name in ("updates", "batch_size", "target_every"):
            if getattr(self, name) < 1:
                raise RlpipeError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.updates > MAX_UPDATES:
            raise RlpipeError(f"updates must be at most {MAX_UPDATES}, got {self.updates}")
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


def _vectors(obs: Columnar) -> np.ndarray:
    """Observations as the float32 vectors FQE's MLP reads (goal Dicts flattened, images' values in a row)."""
    array = flatten_obs(obs)
    return array.reshape(len(array), -1).astype(np.float32)


def _policy_actions(policies: Sequence[ActingPolicy], data: TransitionArrays, rows: np.ndarray, after: bool) -> np.ndarray:
    """Each policy's env actions, [K, N, ...], for the observations at ``rows`` (their
    next_obs with ``after``), in chunks. A policy reading k frames gets each row's stack of
    the episode's last k frames (`rlpipe.datasets.frames`), as it saw them in training."""
    chunks = [rows[i : i + _CHUNK] for i in range(0, len(rows), _CHUNK)]
    starts = chain_starts(data.episode_id, data.step)

    def observations(k: int, chunk: np.ndarray) -> Columnar:
        if k == 1:
            return map_columnar(data.next_obs if after else data.obs, lambda a: np.asarray(a)[chunk])
        depths = stack_depths(starts, k)
        obs, next_obs = cast(np.ndarray, data.obs), cast(np.ndarray, data.next_obs)  # stacked frames: image arrays
        return stacked_next(obs, next_obs, chunk, depths, k) if after else stacked(obs, chunk, depths, k)

    # LoadedPolicy annotates array observations, but it takes goal Dict ones too
    return np.stack([np.concatenate([policy(observations(policy.frame_stack, chunk)) for chunk in chunks]) for policy in policies])  # type: ignore[arg-type]


def fitted_q_evaluation(policies: Sequence[ActingPolicy], data: TransitionArrays, config: FQEConfig = FQEConfig()) -> list[FQEResult]:
    """Estimate each policy's discounted return from `data` (module doc). The K policies
    (of one env) are fitted together: K Q-networks fused into one ensemble, trained on the
    same minibatches, each towards its own policy's targets."""
    config.check()
    if not policies:
        raise RlpipeError("FQE needs at least one policy")
    space = policies[0].action_space
    if any(policy.action_space != space for policy in policies):
        raise RlpipeError("FQE of several policies needs them to share one action space")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    discrete = isinstance(space, spaces.Discrete)
    scaler = ActionScaler(space)
    initial = np.flatnonzero(np.asarray(data.step) == 0)
    if len(initial) == 0:
        raise RlpipeError("the dataset holds no initial states (step 0): FQE estimates the return from them")
    first_obs = map_columnar(data.obs, lambda a: np.asarray(a)[initial])

    def encode(actions: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(scaler.from_env(actions), dtype=torch.int64 if discrete else torch.float32)

    rewards = np.asarray(data.reward, np.float64)
    reward_scale = float(np.abs(rewards).max()) / (1 - config.gamma) or 1.0
    columns = {
        "obs": torch.as_tensor(_vectors(data.obs)),
        "actions": encode(np.asarray(data.action)),
        "rewards": torch.as_tensor(rewards / reward_scale, dtype=torch.float32),
        "next_obs": torch.as_tensor(_vectors(data.next_obs)),
        "alive": torch.as_tensor(1.0 - np.asarray(data.terminated, np.float32)),
    }
    next_actions = encode(_policy_actions(policies, data, np.arange(len(data)), after=True))  # [K, N, ...]: pi(s') once per row
    k, obs_dim = len(policies), columns["obs"].shape[1]
    in_dim = obs_dim if discrete else obs_dim + int(np.prod(cast(spaces.Box, space).shape))
    q_net = EnsembleMLP(k, in_dim, int(cast(spaces.Discrete, space).n) if discrete else 1, config.hidden)
    target = EnsembleMLP(k, in_dim, int(cast(spaces.Discrete, space).n) if discrete else 1, config.hidden)
    target.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=config.learning_rate)

    def q_value(net: EnsembleMLP, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[K, B] values of ``actions`` ([B, ...] shared or [K, B, ...] per member) in ``states`` [B, obs_dim]."""
        actions = actions.expand(k, *actions.shape) if actions.dim() < (2 if discrete else 3) else actions
        if discrete:
            return net(states).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return net(torch.cat([states.expand(k, *states.shape), actions.flatten(2)], dim=-1)).squeeze(-1)

    for update in range(config.updates):
        index = torch.randint(len(rewards), (config.batch_size,), generator=generator)
        batch = {name: column[index] for name, column in columns.items()}
        with torch.no_grad():
            bootstrap = q_value(target, batch["next_obs"], next_actions[:, index])
            y = batch["rewards"] + config.gamma * batch["alive"] * bootstrap
        loss = (q_value(q_net, batch["obs"], batch["actions"]) - y).square().mean(1).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (update + 1) % config.target_every == 0:
            target.load_state_dict(q_net.state_dict())

    with torch.no_grad():
        first = torch.as_tensor(_vectors(first_obs))
        first_actions = encode(_policy_actions(policies, data, initial, after=False))
        values = q_value(q_net, first, first_actions).numpy().astype(np.float64) * reward_scale
    n = values.shape[1]
    return [FQEResult(float(v.mean()), float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"), n, asdict(config)) for v in values]


__all__ = ["ActingPolicy", "FQEConfig", "FQEResult", "fitted_q_evaluation"]
