"""Windows of consecutive steps for sequence models (Decision Transformer, recurrent policies).

A window is the K steps of one episode ending at a drawn row, oldest first, with each step's
return-to-go and episode timestep. Windows never cross an episode start (nor a subset's gap):
a row fewer than K-1 steps into its episode gets a window padded on the left, with ``mask``
False at the padding (which repeats the episode's first step, so it holds valid values).
Ending windows at the drawn step makes every step the last, fully conditioned position of a
window as often as any other, as a sequence model acts at evaluation time (d3rlpy's slicer
does the same; CORL's DT pads on the right instead).

Rows are drawn uniformly over steps, or with ``per_episode`` an episode uniformly and then a
step in it. The gather is the frame stacks' index arithmetic (`rlpipe.datasets.frames`): one
uint8 depth per row; returns-to-go (float32) are computed once: 5 bytes per row beside the
columns. A timestep is its chain's first step plus the row's distance from the chain's first
row: one int64 per chain, not an int32 per row. In-RAM datasets are gathered on the device;
a memory-mapped dataset (`MappedTransitions`) is gathered from its shards per batch, never
loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from rlpipe.datasets.frames import MAX_FRAME_STACK, chain_starts, returns_to_go, stack_depths
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_BATCH_SIZE, check_count
from rlpipe.training.env import ActionScaler
from rlpipe.training.offline import OfflineData
from rlpipe.training.sampler import _GeneratorState, _StackRows, _to_tensor, gather_rows

MAX_WINDOW = MAX_FRAME_STACK
WINDOW_COLUMNS = ("obs", "action", "reward", "terminated")


class WindowBatch(NamedTuple):
    """``batch_size`` windows of ``window`` steps, oldest first; padding (``mask`` False) on the left."""

    obs: torch.Tensor  # [B, K, *obs]
    actions: torch.Tensor  # [B, K, *action] (continuous ones mapped by the sampler's action_map)
    rewards: torch.Tensor  # [B, K]
    returns_to_go: torch.Tensor  # [B, K]: the episode's rewards from this step on, undiscounted
    timesteps: torch.Tensor  # [B, K] int64: the step's index in its episode
    terminated: torch.Tensor  # [B, K] float
    mask: torch.Tensor  # [B, K] bool: True at the window's real steps

    @property
    def starts(self) -> torch.Tensor:
        """[B, K] bool: each window's first real step (a recurrent state starts fresh there)."""
        before = torch.zeros_like(self.mask)
        before[:, 1:] = self.mask[:, :-1]
        return self.mask & ~before


class WindowSampler(_GeneratorState):
    """Windows of ``window`` consecutive steps from a loaded (`TransitionArrays`) or
    memory-mapped (`MappedTransitions`) single-agent dataset of array observations.

    ``sample(B)`` is ``take(draw(B))``: ``draw`` picks the windows' last rows (uniform over
    steps; with ``per_episode``, uniform over episodes first), ``take`` gathers them.
    """

    def __init__(
        self,
        data: TransitionArrays | MappedTransitions,
        window: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        action_map: Callable[[np.ndarray], np.ndarray] | None = None,
        per_episode: bool = False,
        shuffle_returns_to_go: bool = False,
    ) -> None:
        if not 1 <= window <= MAX_WINDOW:
            raise RlpipeError(f"window must be from 1 to {MAX_WINDOW} steps, got {window}")
        self.device = torch.device(device)
        self.window, self.size = window, len(data)
        if self.size == 0:
            raise RlpipeError("cannot sample from an empty dataset")
        self.action_map = action_map
        self._mapped = data if isinstance(data, MappedTransitions) else None
        if isinstance(data, MappedTransitions):
            if data.multi_agent or isinstance(data.take(np.zeros(1, np.int64), ("obs",))["obs"], dict):
                raise RlpipeError("windows are defined for single-agent datasets of array observations only")
            starts, steps = data.chains()
            reward = np.asarray(data.column("reward"))
            on = torch.device("cpu")  # gathered on the CPU beside the shards, then moved
        else:
            if data.agent is not None or isinstance(data.obs, dict):
                raise RlpipeError("windows are defined for single-agent datasets of array observations only")
            starts, steps, reward = chain_starts(data.episode_id, data.step), np.asarray(data.step), np.asarray(data.reward)
            on = self.device
            actions = np.asarray(data.action) if action_map is None else action_map(np.asarray(data.action))
            self._columns = {
                "obs": _to_tensor(np.asarray(data.obs), on),
                "action": _to_tensor(actions, on),
                "reward": _to_tensor(np.asarray(data.reward), on),
                "terminated": _to_tensor(np.asarray(data.terminated), on).float(),
            }
        first = np.flatnonzero(starts)
        self._chain_rows = torch.from_numpy(first).to(on)
        self._step_offsets = torch.from_numpy(steps[first].astype(np.int64) - first).to(on)  # a row's timestep less its row number
        rtg = returns_to_go(reward, starts)
        if shuffle_returns_to_go:
            rtg = shuffled_within_steps(rtg, steps, seed)
        del steps  # before the per-row arrays below: 4 bytes a row less at the peak
        self._chain_first = self._chain_rows.to(self.device)  # the same tensor unless gathered on the CPU for another device
        self._stacks = _StackRows(stack_depths(starts, window), window, on)
        self._returns_to_go = torch.from_numpy(rtg).to(on)
        self._chain_length = torch.from_numpy(np.diff(np.r_[first, len(starts)])).to(self.device)
        self.per_episode = per_episode
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    def sample(self, batch_size: int) -> WindowBatch:
        """``batch_size`` windows drawn with replacement."""
        return self.take(self.draw(batch_size))

    def draw(self, batch_size: int) -> torch.Tensor:
        """The last rows of ``batch_size`` windows (the sampler's generator)."""
        check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
        if not self.per_episode:
            return torch.randint(self.size, (batch_size,), device=self.device, generator=self._generator)
        chain = torch.randint(len(self._chain_first), (batch_size,), device=self.device, generator=self._generator)
        within = torch.rand(batch_size, device=self.device, generator=self._generator) * self._chain_length[chain]
        return self._chain_first[chain] + within.long()

    def take(self, last: torch.Tensor) -> WindowBatch:
        """The windows ending at rows ``last`` ([B]) as a WindowBatch on the device."""
        on = self._stacks.offsets.device
        last = last.to(on)
        rows = self._stacks.rows(last)  # [B, K], padding clamped to the episode's first row
        mask = self._stacks.offsets <= gather_rows(self._stacks.depths, last).unsqueeze(-1).long()
        if self._mapped is None:
            columns = {name: gather_rows(column, rows) for name, column in self._columns.items()}
        else:
            columns = self._gather_mapped(rows)
        return WindowBatch(
            obs=columns["obs"].to(self.device),
            actions=columns["action"].to(self.device),
            rewards=columns["reward"].to(self.device),
            returns_to_go=gather_rows(self._returns_to_go, rows).to(self.device),
            timesteps=self._timesteps(last, rows).to(self.device),
            terminated=columns["terminated"].to(self.device),
            mask=mask.to(self.device),
        )

    def _timesteps(self, last: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[B, K] int64: the windows' rows ``rows`` (ending at ``last``) as steps of their episodes."""
        chain = torch.searchsorted(self._chain_rows, last.long(), right=True) - 1
        return gather_rows(self._step_offsets, chain).unsqueeze(-1) + rows

    def _gather_mapped(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        assert self._mapped is not None
        at = rows.reshape(-1).numpy()
        gathered = {name: np.asarray(values) for name, values in self._mapped.take(at, WINDOW_COLUMNS).items()}
        if self.action_map is not None:
            gathered["action"] = self.action_map(gathered["action"])
        columns = {name: _to_tensor(values, torch.device("cpu")) for name, values in gathered.items()}
        columns["terminated"] = columns["terminated"].float()
        return {name: column.reshape(*rows.shape, *column.shape[1:]) for name, column in columns.items()}


def window_sampler(
    data: OfflineData, window: int, seed: int, per_episode: bool = False, shuffle_returns_to_go: bool = False
) -> WindowSampler:
    """A `WindowSampler` over the dataset `load_offline` opened (in RAM or mapped), on its
    device, with continuous actions mapped to the policy's [-1, 1] range as its sampler maps them."""
    scaler = ActionScaler(data.action_space)
    return WindowSampler(data.arrays, window, data.device, seed, scaler.from_env, per_episode, shuffle_returns_to_go)


def shuffled_within_steps(values: np.ndarray, steps: np.ndarray, seed: int) -> np.ndarray:
    """``values`` with each row's taken from a random row of the same timestep (a seeded
    permutation within each step): returns-to-go keep their distribution at every step, but
    no longer say anything about the episode they sit in (the control of return conditioning)."""
    in_order = np.argsort(steps, kind="stable")
    shuffled = np.lexsort((np.random.default_rng(seed).random(len(steps)), steps))
    out = np.empty_like(values)
    out[in_order] = values[shuffled]
    return out
