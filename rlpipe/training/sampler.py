"""Sampling minibatches from a loaded dataset: the torch side of `rlpipe.datasets.loader`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from rlpipe.datasets.frames import chain_starts, check_frame_stack, stack_depths, stack_offsets, stack_rows
from rlpipe.datasets.loader import TransitionArrays
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.schema import map_columnar
from rlpipe.errors import RlpipeError
from rlpipe.limits import MAX_BATCH_SIZE, check_count
from rlpipe.training.buffer import Batch, ReturnsToGo


def _to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    with warnings.catch_warnings():
        # Memory-mapped views are read-only; tensors built on them are never written to.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).to(device)


def frame_depths(data: TransitionArrays, frame_stack: int) -> np.ndarray | None:
    """Each row's stack depth (`rlpipe.datasets.frames.stack_depths`), or None for ``frame_stack`` 1."""
    check_frame_stack(frame_stack)
    if frame_stack == 1:
        return None
    if data.agent is not None or isinstance(data.obs, dict):
        raise RlpipeError("frame stacks are defined for single-agent datasets of array observations only")
    return stack_depths(chain_starts(data.episode_id, data.step), frame_stack)


def gather_rows(column: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``column[index]`` for an index of any shape, by ``index_select``: 2.6x faster than
    advanced indexing on vector rows, 20x on 84 x 84 frames (one thread, CPU)."""
    return column.index_select(0, index.reshape(-1)).reshape(*index.shape, *column.shape[1:])


class _StackRows:
    """Stacks gathered by index arithmetic: the rows of the stack ending at row t are
    ``t - min(offset, depth[t])`` for offsets k-1..0 (`rlpipe.datasets.frames`)."""

    def __init__(self, depths: np.ndarray, frame_stack: int, device: torch.device) -> None:
        self.depths = torch.from_numpy(depths).to(device)
        self.offsets = torch.from_numpy(stack_offsets(frame_stack)).to(device)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """``[*index.shape, k]`` rows, oldest first."""
        return index.unsqueeze(-1) - torch.minimum(self.offsets, gather_rows(self.depths, index).unsqueeze(-1).long())

    @staticmethod
    def following(frames: torch.Tensor, next_obs: torch.Tensor, axis: int) -> torch.Tensor:
        """The stack after a transition: its obs stack (stacked on ``axis``) less the oldest frame, then next_obs."""
        return torch.cat([frames.narrow(axis, 1, frames.shape[axis] - 1), next_obs.unsqueeze(axis)], dim=axis)


class _GeneratorState:
    """A sampler's resumable state: its index generator's (what a resumed run needs to draw the same batches)."""

    _generator: torch.Generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self._generator.set_state(state["generator"])


def next_action_rows(data: TransitionArrays) -> np.ndarray:
    """The row holding each transition's next action: the next row when it is the same
    episode's next step; else (an episode's last row, where nothing follows in the data) the
    row itself."""
    if data.agent is not None:
        raise RlpipeError("next actions are defined for single-agent datasets only")
    rows = np.arange(len(data))
    follows = (data.episode_id[1:] == data.episode_id[:-1]) & (data.step[1:] == data.step[:-1] + 1)
    return np.where(np.r_[follows, False], rows + 1, rows)


class TransitionSampler(_GeneratorState):
    """Uniform minibatch sampler over a dataset held as tensors on `device`.

    Yields `rlpipe.training.buffer.Batch` (obs, actions, rewards, next_obs, terminated), the
    type online replay buffers yield, so offline algorithms reuse the same update code.
    The data is moved to the device once; each `sample` is one random index draw and one
    gather per column, no Python loop over rows. `action_map` converts stored env actions
    once (e.g. to the policy's [-1, 1] range). With `next_actions` batches also carry the
    dataset's action at `next_obs` (`next_action_rows`); with `returns_to_go`, each row's
    discounted return to its chain's end (`ReturnsToGo`). With `frame_stack` k > 1, obs and
    next_obs are `[B, k, *frame]` stacks of the episode's last k frames (`rlpipe.datasets.frames`).
    """

    def __init__(
        self,
        data: TransitionArrays,
        device: str | torch.device = "cpu",
        seed: int = 0,
        action_map: Callable[[np.ndarray], np.ndarray] | None = None,
        next_actions: bool = False,
        frame_stack: int = 1,
        returns_to_go: ReturnsToGo | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.size = len(data)
        if self.size == 0:
            raise RlpipeError("cannot sample from an empty dataset")
        depths = frame_depths(data, frame_stack)
        self.frame_stack = frame_stack
        self._stacks = None if depths is None else _StackRows(depths, frame_stack, self.device)
        actions = np.asarray(data.action) if action_map is None else action_map(np.asarray(data.action))
        # Tensors on the device (a Dict observation's column: a dict of them, as map_columnar leaves it).
        self._columns: dict[str, Any] = {
            "obs": map_columnar(data.obs, lambda a: _to_tensor(np.asarray(a), self.device)),
            "actions": _to_tensor(actions, self.device),
            "rewards": _to_tensor(np.asarray(data.reward), self.device),
            "next_obs": map_columnar(data.next_obs, lambda a: _to_tensor(np.asarray(a), self.device)),
            "terminated": _to_tensor(np.asarray(data.terminated), self.device).float(),
        }
        if next_actions:
            self._columns["next_actions"] = _to_tensor(actions[next_action_rows(data)], self.device)
        self.returns_to_go = returns_to_go  # what online rows joined to these must carry too
        if returns_to_go is not None:
            if data.agent is not None:
                raise RlpipeError("returns-to-go are defined for single-agent datasets only")
            values = returns_to_go.of(data.reward, chain_starts(data.episode_id, data.step))
            self._columns["returns_to_go"] = _to_tensor(values, self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    def sample(self, batch_size: int) -> Batch:
        """A batch of `batch_size` transitions drawn uniformly with replacement."""
        return self.take(self.draw(batch_size))

    def draw(self, batch_size: int) -> torch.Tensor:
        """`batch_size` row indices drawn uniformly with replacement (the sampler's generator)."""
        check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
        return torch.randint(self.size, (batch_size,), device=self.device, generator=self._generator)

    def take(self, index: torch.Tensor) -> Batch:
        """The rows at `index` (on the device) as a Batch: one gather per column."""
        if self._stacks is None:
            gathered = {name: map_columnar(column, lambda t: gather_rows(t, index)) for name, column in self._columns.items()}
            return Batch(**cast("dict[str, Any]", gathered))  # tensors, which map_columnar's Columnar does not name
        columns = {name: gather_rows(column, index) for name, column in self._columns.items() if name != "obs"}
        columns["obs"] = gather_rows(self._columns["obs"], self._stacks.rows(index))
        columns["next_obs"] = self._stacks.following(columns["obs"], columns["next_obs"], index.dim())
        return Batch(**columns)


class SeedSampler:
    """Minibatches for K seeds trained together (rlpipe.training.seedstack): each seed draws
    its indices from its own generator, seeded like a separate run's `TransitionSampler`
    (so seed k gets the batches a separate run of seed k gets), from one shared copy of the
    data. Batches carry a leading seed dimension: [K, B, ...].
    """

    def __init__(self, sampler: TransitionSampler, seeds: list[int]) -> None:
        self.sampler = sampler
        self.device = sampler.device
        self._generators = [torch.Generator(device=self.device).manual_seed(seed) for seed in seeds]

    def sample(self, batch_size: int) -> Batch:
        return self.take(self.draw(batch_size))

    def draw(self, batch_size: int) -> torch.Tensor:
        """[K, batch_size] row indices, row k from seed k's generator."""
        check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
        return torch.stack([torch.randint(self.sampler.size, (batch_size,), device=self.device, generator=g) for g in self._generators])

    def take(self, index: torch.Tensor) -> Batch:
        return self.sampler.take(index)


class MappedSampler(_GeneratorState):
    """Uniform minibatches gathered from a dataset's memory-mapped shards (`MappedTransitions`):
    for datasets larger than memory. Nothing is copied up front; each batch is gathered
    from the maps, converted like `TransitionSampler` converts the whole dataset (actions
    through `action_map`, float64 as float32) and moved to `device`.

    The same seed draws the same indices as `TransitionSampler` (one torch generator on
    `device`), so both give the same batches, frame stacks included (`frame_stack`).
    """

    def __init__(
        self,
        data: MappedTransitions,
        device: str | torch.device = "cpu",
        seed: int = 0,
        action_map: Callable[[np.ndarray], np.ndarray] | None = None,
        frame_stack: int = 1,
    ) -> None:
        self.device = torch.device(device)
        self.data = data
        self.size = len(data)
        if self.size == 0:
            raise RlpipeError("cannot sample from an empty dataset")
        check_frame_stack(frame_stack)
        self.frame_stack = frame_stack
        self._depths = None if frame_stack == 1 else data.stack_depths(frame_stack)
        self.action_map = action_map
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    def sample(self, batch_size: int) -> Batch:
        """A batch of `batch_size` transitions drawn uniformly with replacement."""
        return self.take(self.draw(batch_size))

    def draw(self, batch_size: int) -> torch.Tensor:
        """`batch_size` row indices drawn uniformly with replacement (the sampler's generator)."""
        check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
        return torch.randint(self.size, (batch_size,), device=self.device, generator=self._generator)

    def take(self, index: torch.Tensor) -> Batch:
        """The rows at `index` as a Batch on the device."""
        at = index.cpu().numpy()
        # Every column an array: goal Dict observations are sampled in RAM, flattened (`load_offline`).
        if self._depths is None:
            rows = cast("dict[str, np.ndarray]", self.data.take(at))
        else:  # the stacks' frames in one gather; next_obs stacks reuse them
            rows = cast("dict[str, np.ndarray]", self.data.take(at, ("action", "reward", "next_obs", "terminated")))
            frames = stack_rows(at, self._depths, self.frame_stack)
            rows["obs"] = cast(np.ndarray, self.data.take(frames.reshape(-1), ("obs",))["obs"]).reshape(
                frames.shape + rows["next_obs"].shape[1:]
            )
        actions = rows["action"] if self.action_map is None else self.action_map(rows["action"])
        obs: Any = map_columnar(rows["obs"], lambda a: _to_tensor(a, self.device))  # tensors
        next_obs: Any = map_columnar(rows["next_obs"], lambda a: _to_tensor(a, self.device))
        return Batch(
            obs=obs,
            actions=_to_tensor(actions, self.device),
            rewards=_to_tensor(rows["reward"], self.device),
            next_obs=next_obs if self._depths is None else _StackRows.following(obs, next_obs, at.ndim),
            terminated=_to_tensor(rows["terminated"], self.device).float(),
        )
