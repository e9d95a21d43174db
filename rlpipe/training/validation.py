"""Training on data with no environment: a dataset whose metadata names none (``env_id``
null, e.g. imported logs of a system nobody simulates) cannot score a policy by playing it.

An offline run on such data instead:

1. holds out ``validation_fraction`` of the dataset's episodes (whole episodes, drawn with the
   run's seed) and trains on the rest;
2. at every evaluation point scores the policy's deterministic actions against the held-out
   episodes' logged actions (`ValidationSet.action_error`: mean squared error in the policy's
   [-1, 1] action units, or the share of differing actions for discrete ones), measures a value
   method's critics there (`ValidationSet.td_error`: their squared TD error against the
   algorithm's own target) and keeps a copy of the actor's weights (`Snapshots`);
3. after training fits FQE (`rlpipe.training.fqe.fitted_q_evaluation`) for all those copies at
   once on the whole dataset, which estimates each one's discounted return from the data's
   initial states;
4. keeps the copy ``select_by`` picks: the last one, the lowest validation error or the
   highest FQE estimate. The saved policy is that copy; the other modules (critics, their
   optimisers) are the last update's.

The action error measures how far the policy is from the logging policy, which is what BC
minimises and what a good offline RL policy may deliberately depart from; FQE measures value
but carries its regression's bias. docs/your-own-data.md#choosing-a-checkpoint-measured states
what the two selected on data where the truth is known.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property, partial
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlpipe.datasets.loader import TransitionArrays
from rlpipe.envs.spaces import ActionScaler
from rlpipe.errors import RlpipeError
from rlpipe.training.evaluation import PolicyFn
from rlpipe.training.losses import TDErrors
from rlpipe.training.sampler import TransitionSampler

VALIDATION_SEED_OFFSET = 40_000  # the held-out episodes' draw: its own stream of the run's seed
_CHUNK = 65_536  # observations per policy call


def split_episodes(data: TransitionArrays, fraction: float, seed: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the training episodes and of the held-out ones: ``fraction`` of the episodes
    (at least one, at most all but one) drawn without replacement."""
    starts = data.episode_starts()
    episodes = len(starts)
    if episodes < 2:
        raise RlpipeError(f"dataset {name!r} holds {episodes} episode: data with no environment needs two to hold one out for validation")
    held_out = min(max(1, round(fraction * episodes)), episodes - 1)
    chosen = np.random.default_rng(seed + VALIDATION_SEED_OFFSET).choice(episodes, held_out, replace=False)
    in_validation = np.zeros(episodes, bool)
    in_validation[chosen] = True
    lengths = np.diff(np.r_[starts, len(data)])
    row_mask = np.repeat(in_validation, lengths)
    return np.flatnonzero(~row_mask), np.flatnonzero(row_mask)


class ValidationSet:
    """Held-out episodes' observations and logged actions, in the policy's action units; and
    their transitions as the run's batches (``transitions(data)``: a `TransitionSampler` as
    training's, built when a critic is first measured; by default on the CPU, actions in the
    policy's units)."""

    def __init__(
        self,
        data: TransitionArrays,
        action_space: spaces.Space,
        transitions: Callable[[TransitionArrays], TransitionSampler] | None = None,
    ) -> None:
        self.data = data
        self.scaler = ActionScaler(action_space)
        self.actions = self.scaler.from_env(np.asarray(data.action))
        self.obs = np.asarray(data.obs)
        self._make_transitions = transitions or partial(TransitionSampler, action_map=self.scaler.from_env)

    @cached_property
    def transitions(self) -> TransitionSampler:
        return self._make_transitions(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def action_error(self, policy: PolicyFn) -> float:
        """The policy's error on the held-out rows: mean squared error of its actions in
        [-1, 1] units (continuous), or the share of rows where its action differs (discrete)."""
        predicted = np.concatenate([self.scaler.from_env(policy(self.obs[i : i + _CHUNK])) for i in range(0, len(self.obs), _CHUNK)])
        if self.scaler.discrete:
            return float(np.mean(predicted != self.actions))
        return float(np.mean(np.square(predicted - self.actions)))

    def td_error(self, td_errors: TDErrors) -> float:
        """The mean of ``td_errors`` over every held-out transition. Its targets may sample
        (a next action, target noise): they draw from a forked RNG, so measuring leaves the
        training's random stream as it was."""
        rows, device = self.transitions.size, self.transitions.device
        total = 0.0
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for start in range(0, rows, _CHUNK):
                index = torch.arange(start, min(start + _CHUNK, rows), device=device)
                total += float(td_errors(self.transitions.take(index)).sum())
        return total / rows


@dataclass(frozen=True)
class SnapshotPolicy:
    """An actor copy's policy function with its action space: what FQE evaluates."""

    fn: PolicyFn
    action_space: spaces.Space

    @property
    def frame_stack(self) -> int:
        return 1  # runs on data with no environment read one observation (require_validatable)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return self.fn(obs)


@dataclass(frozen=True)
class Snapshot:
    """The actor's weights at one evaluation point and how they scored."""

    updates: int
    state: dict[str, torch.Tensor]
    action_error: float
    td_error: float | None = None
    fqe_estimate: float | None = None
    fqe_standard_error: float | None = None

    def record(self) -> dict[str, Any]:
        """This checkpoint's row of ``metrics.json``'s ``checkpoints``."""
        row: dict[str, Any] = {"updates": self.updates, "val_action_error": self.action_error}
        if self.td_error is not None:
            row["val_td_error"] = self.td_error
        if self.fqe_estimate is not None:
            row |= {"fqe_estimate": self.fqe_estimate, "fqe_standard_error": self.fqe_standard_error}
        return row


class Snapshots:
    """Copies of the actor taken at each evaluation of a run on data with no environment."""

    def __init__(self, actor: nn.Module) -> None:
        self.actor = actor
        self.taken: list[Snapshot] = []

    def take(self, updates: int, action_error: float, td_error: float | None = None) -> None:
        if self.taken and self.taken[-1].updates == updates:
            return
        state = {key: value.detach().clone() for key, value in self.actor.state_dict().items()}
        self.taken.append(Snapshot(updates, state, action_error, td_error))

    def actors(self) -> list[nn.Module]:
        """One copy of the actor per snapshot, holding its weights (for FQE)."""
        copies = []
        for snapshot in self.taken:
            actor = copy.deepcopy(self.actor)
            actor.load_state_dict(snapshot.state)
            copies.append(actor.eval())
        return copies

    def score_fqe(self, estimates: Sequence[tuple[float, float]]) -> None:
        self.taken = [
            replace(s, fqe_estimate=estimate, fqe_standard_error=error) for s, (estimate, error) in zip(self.taken, estimates, strict=True)
        ]

    def select(self, rule: str) -> Snapshot:
        """The snapshot ``rule`` picks (ties: the earliest): ``last``, ``val_loss`` (lowest
        action error) or ``fqe`` (highest estimate)."""
        if rule == "last":
            return self.taken[-1]
        if rule == "val_loss":
            return min(self.taken, key=lambda s: s.action_error)
        scored = [s for s in self.taken if s.fqe_estimate is not None and math.isfinite(s.fqe_estimate)]
        if not scored:
            raise RlpipeError("select_by=fqe: FQE gave no finite estimate")
        return max(scored, key=lambda s: float(s.fqe_estimate))  # type: ignore[arg-type]  # filtered above

    def keep(self, chosen: Snapshot) -> None:
        """Load the chosen weights into the run's actor (what the run saves)."""
        self.actor.load_state_dict(chosen.state)

    def state_dict(self) -> dict[str, Any]:
        """The copies taken so far and their scores, for a resumable run (rlpipe.training.resume)."""
        # the fields as they are: dataclasses.asdict would deep-copy every kept copy's weights
        return {"taken": [{f.name: getattr(snapshot, f.name) for f in fields(snapshot)} for snapshot in self.taken]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: a resumed run selects among every copy its first part took."""
        self.taken = [Snapshot(**row) for row in state["taken"]]


__all__ = ["Snapshot", "SnapshotPolicy", "Snapshots", "ValidationSet", "split_episodes"]
