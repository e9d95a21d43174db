"""A preallocated torch replay buffer that samples on its device."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from rlpipe.datasets.frames import discounted_returns_to_go
from rlpipe.envs.stepper import StepBatch
from rlpipe.errors import RlpipeError
from rlpipe.training.diagnostics import Diagnosed


class Batch(NamedTuple):
    """A sampled minibatch; ``terminated`` is float (1.0 = no bootstrap). ``next_actions``
    (the dataset's action at ``next_obs``) and ``returns_to_go`` (`ReturnsToGo`) only from
    samplers asked for them (ReBRAC's, Cal-QL's)."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    next_actions: torch.Tensor | None = None
    returns_to_go: torch.Tensor | None = None

    def map_columns(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """``fn`` applied to each column (an absent optional column stays None)."""
        return Batch._make(None if column is None else fn(column) for column in self)


def join_batches(parts: Sequence[Batch], join: Callable[[tuple[torch.Tensor, ...]], torch.Tensor] = torch.cat) -> Batch:
    """Batches joined column by column (``torch.cat``, or ``torch.stack`` for a seed axis); a
    column that some part lacks (None) is None."""
    # A column that is not None in any part holds tensors only.
    return Batch._make(
        None if any(column is None for column in columns) else join(cast("tuple[torch.Tensor, ...]", columns)) for columns in zip(*parts)
    )


@dataclass(frozen=True)
class ReturnsToGo:
    """What a ``returns_to_go`` column holds: each row's discounted Monte-Carlo return to its
    episode's end, of the rewards as learnt, ``(r + reward_shift) * reward_scale``, discounted
    by ``gamma`` (Cal-QL's value of the policy that collected the data). A truncated episode
    just ends: nothing is bootstrapped after its last row."""

    gamma: float
    reward_shift: float = 0.0
    reward_scale: float = 1.0

    def of(self, reward: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The column for rows of ``reward`` whose chains (episodes) begin where ``starts`` is True."""
        learnt = (np.asarray(reward, np.float64) + self.reward_shift) * self.reward_scale
        return discounted_returns_to_go(learnt, starts, self.gamma)


# One gradient update on a minibatch; the int is the update's index (0, 1, ...). It returns its
# diagnostics (rlpipe.training.diagnostics), or None.
Update = Callable[[Batch, int], Diagnosed]


class ReplayBuffer:
    """Ring buffer of transitions stored as device tensors.

    Actions are stored in the policy's space ([-1, 1] for continuous control; a Discrete
    action as one int64 index column: ``act_dim=1, action_dtype=torch.int64``).
    Observations are stored flat, in ``obs_dtype``: an image's own bool or uint8, so a
    MinAtar or Atari replay takes 1/4 of the memory float32 would (the encoder scales them).
    Truncated transitions keep ``terminated = 0`` so the target still bootstraps from
    ``next_obs`` (which must be the real final observation, not the reset one).

    With ``returns_to_go`` the rows also carry that column (one env's steps, through `store`):
    -inf (no value yet) until their episode ends, terminated or truncated, then the episode's
    discounted returns-to-go.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        act_dim: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        *,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
        returns_to_go: ReturnsToGo | None = None,
    ) -> None:
        self.capacity, self.device = int(capacity), torch.device(device)
        self.obs = torch.zeros(self.capacity, obs_dim, dtype=obs_dtype, device=self.device)
        self.next_obs = torch.zeros(self.capacity, obs_dim, dtype=obs_dtype, device=self.device)
        self.actions = torch.zeros(self.capacity, act_dim, dtype=action_dtype, device=self.device)
        self.rewards = torch.zeros(self.capacity, device=self.device)
        self.terminated = torch.zeros(self.capacity, device=self.device)
        self.returns_to_go = returns_to_go
        self.values = None if returns_to_go is None else torch.full((self.capacity,), -math.inf, device=self.device)
        self.columns = self._COLUMNS if returns_to_go is None else (*self._COLUMNS, "values")
        self.episode_rows = 0  # with returns_to_go: rows stored of the episode under way
        self.pos, self.size = 0, 0
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray) -> None:
        """Append a batch of transitions (leading axis = transitions), overwriting the oldest."""
        n = len(rewards)
        if n == 0:
            return
        idx = (self.pos + torch.arange(n)) % self.capacity
        idx = idx.to(self.device)
        columns = {"obs": obs, "next_obs": next_obs, "actions": actions, "rewards": rewards, "terminated": terminated}
        for name, values in columns.items():
            column = getattr(self, name)  # each kept in its own dtype (an image's bool/uint8, an index's int64)
            column[idx] = torch.as_tensor(np.asarray(values), device=self.device).to(column.dtype).reshape(n, *column.shape[1:])
        if self.values is not None:
            self.values[idx] = -math.inf  # known when the episode ends (`store`)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def store(self, step: StepBatch) -> None:
        """Add one vector-env step's transitions, skipping autoreset steps (``valid`` False);
        with returns-to-go, a step that ends the episode fills its rows' values."""
        v = step.valid
        self.add(step.obs[v], step.actions[v], step.rewards[v], step.next_obs[v], step.terminated[v])
        if self.returns_to_go is not None:
            if len(v) != 1:
                raise RlpipeError(f"a replay buffer with returns-to-go stores one env's steps, got {len(v)} envs")
            self.episode_rows += int(v[0])
            if v[0] and (step.terminated[0] or step.truncated[0]):
                self._end_episode()

    def _end_episode(self) -> None:
        """Fill the returns-to-go of the episode that ended at the last row stored."""
        assert self.returns_to_go is not None and self.values is not None
        n = min(self.episode_rows, self.capacity)  # the oldest rows of a longer episode are overwritten
        idx = ((self.pos - n + torch.arange(n)) % self.capacity).to(self.device)
        starts = np.r_[True, np.zeros(n - 1, bool)]
        self.values[idx] = torch.from_numpy(self.returns_to_go.of(self.rewards[idx].cpu().numpy(), starts)).to(self.device)
        self.episode_rows = 0

    _COLUMNS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def state_dict(self) -> dict[str, object]:
        """The stored transitions (views of the filled rows: save them at once), ring position
        and sampling generator (and with returns-to-go, the rows of the episode under way)."""
        rows = {name: getattr(self, name)[: self.size] for name in self.columns}
        episode = {} if self.values is None else {"episode_rows": self.episode_rows}
        return {**rows, **episode, "pos": self.pos, "size": self.size, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name in self.columns:
            getattr(self, name)[: self.size] = state[name]
        self.episode_rows = state.get("episode_rows", 0)
        self.generator.set_state(state["generator"])

    def sample(self, batch_size: int) -> Batch:
        """Uniformly sample ``batch_size`` transitions (with replacement)."""
        return self.take(torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator))

    def take(self, index: torch.Tensor) -> Batch:
        """The stored rows at ``index`` (on the device)."""
        values = None if self.values is None else self.values[index]
        return Batch(
            self.obs[index], self.actions[index], self.rewards[index], self.next_obs[index], self.terminated[index], returns_to_go=values
        )
