"""What multi-agent training shares across env families: a team's shared-policy inputs,
rows of (game x agent) for the on-policy storage, and a shared policy wrapped as a numpy team
policy. The family-specific pieces live in the families' plug-ins
(:mod:`rlpipe.training.multiagent`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

TeamPolicy = Callable[[np.ndarray], np.ndarray]
"""Observations of a batch of teams [B, n_agents, obs_dim] -> their actions [B, n_agents]."""


def with_agent_ids(obs: np.ndarray) -> np.ndarray:
    """Append each agent's one-hot id: [B, A, D] -> [B, A, D + A] float32 (lets a shared policy
    specialise). Training rows and the evaluation's team policy both build their input with it."""
    batch, n_agents = obs.shape[:2]
    ids = np.broadcast_to(np.eye(n_agents, dtype=np.float32), (batch, n_agents, n_agents))
    return np.concatenate([obs.astype(np.float32, copy=False), ids], axis=-1)


@dataclass(frozen=True)
class RowStep:
    """One step of every (game, agent) row: what :class:`rlpipe.training.onpolicy.RolloutStorage` stores."""

    rewards: np.ndarray
    terminated: np.ndarray  # the game ended, or this agent died
    truncated: np.ndarray
    valid: np.ndarray  # False for the games' autoreset steps (and dead agents unless carried): not trained on
    acting: np.ndarray | None = None  # with carried dead agents: False for them (value-only rows)


def action_logits(actor: Any, obs: torch.Tensor) -> torch.Tensor:
    """Action logits of a shared team policy: an ``ActorCritic`` (IPPO's) or a ``CategoricalActor``
    learnt from a team's dataset rows (BC); ``Any`` because the two share no interface."""
    return actor.dist(obs).logits if actor.kind == "categorical" else actor(obs)[0]


def team_policy(
    actor: nn.Module, agent_ids: bool, device: torch.device | str = "cpu", deterministic: bool = True, seed: int = 0
) -> TeamPolicy:
    """Wrap a shared policy (see :func:`action_logits`) as a numpy team policy: greedy, or
    sampled from a generator seeded with ``seed`` (so a stochastic evaluation is reproducible too)."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(with_agent_ids(obs) if agent_ids else obs, dtype=torch.float32, device=device)
            logits = action_logits(actor, x.flatten(0, 1))
            action = logits.argmax(-1) if deterministic else torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
            return action.view(obs.shape[:2]).cpu().numpy()

    return act
