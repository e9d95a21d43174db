"""What on-policy actor-critics share (PPO, GAIL's generator, IPPO): rollout storage and
generalised advantage estimation; the clipped PPO update that learns from them is
:mod:`rlpipe.algos.ppo`'s.

A rollout is ``[T, N]``: T steps of N rows. A row is one env of a vector env today; for a
team of agents sharing one policy a row is one (env, agent) pair, so nothing here changes.
Rows that are reset steps of the NEXT_STEP autoreset (``valid`` False) are kept in the
storage (they keep the [T, N] layout GAE needs) but are never trained on.

A recurrent policy (:class:`RecurrentRolloutStorage`) carries its hidden state from step to
step and rollout to rollout, zeroed where an episode starts: the step after a reset step,
whose observation is the new episode's first. A reset step itself keeps the ended episode's
state, so its value (of the final observation) bootstraps a truncated episode. The update
re-runs the cores over each row's whole rollout from the state stored at its start, in
minibatches of rows (as CleanRL's ``ppo_atari_lstm.py``), so log-probabilities match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from rlpipe.nets.networks import ActorCritic
from rlpipe.nets.recurrent import RecurrentActorCritic
from rlpipe.training.config import Precision


class RowStep(Protocol):
    """One step's outcome per row (what a vector-env step batch provides), read only (a
    frozen dataclass's fields do)."""

    @property
    def rewards(self) -> np.ndarray: ...

    @property
    def terminated(self) -> np.ndarray: ...

    @property
    def truncated(self) -> np.ndarray: ...

    @property
    def valid(self) -> np.ndarray: ...  # False on the reset steps of the NEXT_STEP autoreset

    # A step may also have ``acting`` (bool array): False for valid rows the policy does not
    # act on (a team's dead agent whose row carries the team's later rewards); their value
    # is learnt, their action is not. Without it every valid row acts.


class RowStepper(Protocol):
    """Steps N rows at once: a vector env (rows = envs), or a team sharing one policy
    (rows = env x agent pairs)."""

    obs: np.ndarray  # [N, obs_dim], the rows' current observations

    def step(self, actions: np.ndarray) -> RowStep: ...


class PPOSettings(Protocol):
    """The config fields the clipped update reads (PPO's Config has them)."""

    num_epochs: int
    minibatch_size: int
    normalize_advantages: bool
    vf_coef: float
    ent_coef: float
    max_grad_norm: float
    target_kl: float | None
    precision: Precision


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns for a [T, N] rollout.

    ``values[t]`` is V(obs[t]); ``next_value`` is V of the observation after the last step.
    With NEXT_STEP autoreset, the observation after a done step is the true final one, so
    ``values[t + 1]`` bootstraps truncated episodes, terminated ones bootstrap 0, and the
    advantage recursion stops at every episode end. Reset steps (``valid`` False) get 0.
    """
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    not_term, not_done = 1.0 - terminated.float(), 1.0 - (terminated | truncated).float()
    for t in reversed(range(rewards.shape[0])):
        nv = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        delta = rewards[t] + gamma * nv * not_term[t] - values[t]
        last = (delta + gamma * gae_lambda * not_done[t] * last) * valid[t]
        adv[t] = last
    return adv, adv + values


@dataclass
class RolloutSequences:
    """Each row's whole rollout, ``[N, T]``, for re-running a recurrent core."""

    obs: torch.Tensor  # [N, T, obs_dim]
    starts: torch.Tensor  # [N, T] bool: the state is zeroed before these steps
    initial_state: torch.Tensor  # [N, *state]: the state before the rollout's first step
    rows: torch.Tensor  # [N, T] int64: each step's index in the flattened batch, -1 on reset steps


@dataclass
class PPOBatch:
    """The valid rows of a rollout, flattened: what the minibatch epochs train on."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    acting: torch.Tensor | None = None  # rows whose action is trained on (None: all)
    sequences: RolloutSequences | None = None  # recurrent policies: minibatches are rows' sequences


class RolloutStorage:
    """``[T, N]`` tensors of one rollout on ``device``, refilled by :meth:`collect`."""

    def __init__(self, num_steps: int, num_rows: int, obs_dim: int, act_dim: int, discrete: bool, device: torch.device) -> None:
        T, N = num_steps, num_rows
        self.device = device
        self.obs = torch.zeros(T, N, obs_dim, device=device)
        self.actions = torch.zeros((T, N) if discrete else (T, N, act_dim), dtype=torch.long if discrete else torch.float32, device=device)
        self.log_probs, self.values, self.rewards = (torch.zeros(T, N, device=device) for _ in range(3))
        self.terminated, self.truncated, self.valid, self.acting = (torch.zeros(T, N, dtype=torch.bool, device=device) for _ in range(4))
        self.has_passive_rows = False  # whether some valid rows are not acting (see RowStep.acting)
        self.next_value = torch.zeros(N, device=device)

    def _as_tensor(self, array: object) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)

    def _policy(self, actor: ActorCritic | RecurrentActorCritic, obs: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy head and value of step ``t``'s observations (t = T: the one after the rollout)."""
        return actor(obs)

    @torch.no_grad()
    def collect(self, actor: ActorCritic | RecurrentActorCritic, stepper: RowStepper) -> None:
        """Act with actions sampled from ``actor`` for T steps of ``stepper``; store each
        step and V of the observation after the last one."""
        T = self.obs.shape[0]
        for t in range(T):
            obs = torch.as_tensor(stepper.obs, dtype=torch.float32, device=self.device)
            head, value = self._policy(actor, obs, t)
            action = actor.sample(head)
            self.obs[t], self.actions[t], self.values[t] = obs, action, value
            self.log_probs[t] = actor.log_prob_entropy(head, action)[0]
            b = stepper.step(action.cpu().numpy())
            self.rewards[t], self.terminated[t] = self._as_tensor(b.rewards), self._as_tensor(b.terminated)
            self.truncated[t], self.valid[t] = self._as_tensor(b.truncated), self._as_tensor(b.valid)
            acting = getattr(b, "acting", None)
            self.acting[t] = self.valid[t] if acting is None else self._as_tensor(acting)
        self.has_passive_rows = bool((self.valid & ~self.acting).any())
        self.next_value = self._policy(actor, torch.as_tensor(stepper.obs, dtype=torch.float32, device=self.device), T)[1]

    def batch(self, rewards: torch.Tensor, gamma: float, gae_lambda: float) -> PPOBatch:
        """Advantages and returns of ``rewards`` (the env's, or a learnt reward), and the
        valid rows flattened for the update."""
        with torch.no_grad():
            adv, ret = compute_gae(rewards, self.values, self.next_value, self.terminated, self.truncated, self.valid, gamma, gae_lambda)
        keep = self.valid.reshape(-1)
        rows = lambda x: x.reshape(-1, *x.shape[2:])[keep]  # noqa: E731
        return PPOBatch(
            rows(self.obs),
            rows(self.actions),
            rows(self.log_probs),
            rows(adv),
            rows(ret),
            rows(self.acting) if self.has_passive_rows else None,
        )


class RecurrentRolloutStorage(RolloutStorage):
    """A rollout of a :class:`RecurrentActorCritic`: also each step's ``starts`` and the
    hidden state before the rollout; the state carried between steps (and rollouts) is
    ``state``, which a resumable checkpoint saves (:meth:`state_dict`)."""

    def __init__(
        self, actor: RecurrentActorCritic, num_steps: int, num_rows: int, obs_dim: int, act_dim: int, device: torch.device
    ) -> None:
        super().__init__(num_steps, num_rows, obs_dim, act_dim, actor.discrete, device)
        self.starts = torch.zeros(num_steps, num_rows, dtype=torch.bool, device=device)
        self.state = actor.initial_state(num_rows)
        self.initial_state = self.state.clone()

    def _policy(self, actor: ActorCritic | RecurrentActorCritic, obs: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        # valid[t - 1] is the previous step's (at t = 0 the last rollout's; before the first
        # rollout all False, so every row starts): a reset step's next observation starts an episode.
        start = ~self.valid[t - 1]
        head, value, state = actor(obs[:, None], self.state, start[:, None])
        if t < self.obs.shape[0]:
            if t == 0:
                self.initial_state = self.state
            self.starts[t], self.state = start, state
        return head[:, 0], value[:, 0]

    def batch(self, rewards: torch.Tensor, gamma: float, gae_lambda: float) -> PPOBatch:
        """The valid rows as :meth:`RolloutStorage.batch`, with each row's sequence."""
        flat = super().batch(rewards, gamma, gae_lambda)
        rows = torch.where(self.valid, self.valid.reshape(-1).cumsum(0).reshape(self.valid.shape) - 1, -1)
        flat.sequences = RolloutSequences(self.obs.transpose(0, 1), self.starts.T, self.initial_state, rows.T)
        return flat

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What the next rollout continues from: the carried state and the last step's ``valid``."""
        return {"state": self.state, "valid": self.valid[-1]}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state["state"].to(self.device)
        self.valid[-1] = state["valid"].to(self.device)
