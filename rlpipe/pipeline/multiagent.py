"""Multi-agent datasets: Combat episodes stored one row per living agent per step.

Rows carry the dataset schema's ``agent`` column (``agent_0``, ``agent_1``, ...); rows of
an episode are sorted by (step, agent). An agent's row holds its own observation, action
and reward; ``terminated`` / ``truncated`` are the game's. Dead agents (who observe zeros
and whose actions are ignored) get no rows. Arrow only: Minari's HDF5 has no multi-agent
layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlpipe.envs.combat import CombatVectorEnv

TeamPolicy = Callable[[np.ndarray], np.ndarray]  # [B, n_agents, obs_dim] -> [B, n_agents]
RowSink = Callable[[dict[str, Any]], None]


def random_team_policy(n_actions: int, seed: int) -> TeamPolicy:
    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, n_actions, size=obs.shape[:2])


def collect_combat(
    sink: RowSink,
    make_policy: Callable[[CombatVectorEnv], TeamPolicy],
    episodes: int,
    num_envs: int,
    seed: int,
    rules: dict[str, Any] | None = None,
) -> None:
    """Play ``episodes`` whole Combat episodes on ``num_envs`` batched games and pass each
    finished episode's rows to ``sink`` (episode ids in order of completion)."""
    envs = CombatVectorEnv(num_envs, **(rules or {}))
    policy = make_policy(envs)
    names = np.array([f"agent_{i}" for i in range(envs.rules.team_size)])
    obs, info = envs.reset(seed=seed)
    alive = info["alive"]
    history: list[dict[str, np.ndarray]] = []  # one entry per batched step
    start = np.zeros(num_envs, np.int64)  # index in history where each game's episode began
    next_id = 0
    while next_id < episodes:
        action = policy(obs)
        next_obs, reward, term, trunc, info = envs.step(action)
        history.append(
            {
                "obs": obs,
                "action": action,
                "reward": reward,
                "next_obs": next_obs,
                "terminated": term,
                "truncated": trunc,
                "acting": alive & info["valid"][:, None],
            }
        )
        for g in np.flatnonzero(term | trunc):
            if next_id < episodes:
                sink(_episode_rows(history[start[g] :], g, next_id, names))
                next_id += 1
            start[g] = len(history) + 1  # the next step is the autoreset step
        first = min(int(start.min()), len(history))  # drop steps no unfinished episode needs (start may point past the end)
        if first > 0:
            history, start = history[first:], start - first
        obs, alive = next_obs, info["alive"]


def _episode_rows(steps: list[dict[str, np.ndarray]], game: int, episode_id: int, names: np.ndarray) -> dict[str, Any]:
    """The rows of game ``game``'s episode from its per-step batched records."""
    acting = np.stack([s["acting"][game] for s in steps])  # [T, A]
    t, a = np.nonzero(acting)
    pick = lambda key: np.stack([s[key][game] for s in steps])  # noqa: E731
    return {
        "episode_id": np.full(t.size, episode_id, np.int64),
        "step": t.astype(np.int32),
        "agent": names[a],
        "obs": pick("obs")[t, a],
        "action": pick("action")[t, a].astype(np.int64),
        "reward": pick("reward")[t, a].astype(np.float32),
        "next_obs": pick("next_obs")[t, a],
        "terminated": pick("terminated")[t],
        "truncated": pick("truncated")[t],
    }
