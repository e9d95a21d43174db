"""A tiny env family for tests/test_env_families.py, kept outside rlpipe: ``Coin-v0``, where
two agents each see a coin (a one-hot observation) and score a hit by naming it. One step per
episode; the team's return is its hits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlpipe.training.evaluation import EvalResult
from rlpipe.training.multiagent import FamilyPlugin, RowSink, SavedActor

AGENTS = 2
OBSERVATION_SPACE = spaces.Box(0.0, 1.0, (2,), np.float32)
ACTION_SPACE = spaces.Discrete(2)


def coins(episodes: int, seed: int) -> np.ndarray:
    """The coins of ``episodes`` games, [episodes, agents]."""
    return np.random.default_rng(seed).integers(0, 2, size=(episodes, AGENTS))


def play(policy: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> EvalResult:
    """Every agent of every game names its coin with ``policy`` ([rows, 2] -> [rows])."""
    coin = coins(episodes, seed)
    hits = (policy(np.eye(2, dtype=np.float32)[coin.reshape(-1)]).reshape(coin.shape) == coin).sum(1)
    return EvalResult(float(hits.mean()), float(hits.std()), hits.astype(float).tolist(), [1] * episodes, float((hits == AGENTS).mean()))


class CoinEvaluator:
    def __init__(self, info: Any) -> None:
        self.env_kwargs: dict[str, Any] = {"agents": AGENTS}
        self.latest: EvalResult | None = None

    def spaces(self) -> tuple[spaces.Space, spaces.Space]:
        return OBSERVATION_SPACE, ACTION_SPACE

    def __call__(self, policy: Callable[[np.ndarray], np.ndarray], episodes: int, seed: int) -> EvalResult:
        self.latest = play(policy, episodes, seed)
        return self.latest

    def metrics(self) -> dict[str, Any]:
        return {} if self.latest is None else {"eval_coin_hit_rate": self.latest.mean / AGENTS}


def evaluate_run(
    saved: SavedActor, episodes: int, seed: int, deterministic: bool, device: Any, adversary: Callable[[], SavedActor] | None
) -> dict[str, Any]:
    def policy(obs: np.ndarray) -> np.ndarray:
        return saved.actor.act(torch.as_tensor(obs, device=device), deterministic).cpu().numpy()

    return {"hit_rate": play(policy, episodes, seed).mean / AGENTS}


class CoinCollection:
    """Random guesses: each game's rows, one per agent."""

    def __init__(self, seed: int) -> None:
        self.observation_space, self.action_space = OBSERVATION_SPACE, ACTION_SPACE
        self.producer: dict[str, Any] = {"algorithm": "random", "checkpoint_sha256": None}

    def play(self, sink: RowSink, episodes: int, num_envs: int, seed: int) -> None:
        rng = np.random.default_rng(seed + 1)
        for k, coin in enumerate(coins(episodes, seed)):
            obs = np.eye(2, dtype=np.float32)[coin]
            action = rng.integers(0, 2, size=AGENTS)
            sink(
                {
                    "episode_id": np.full(AGENTS, k, np.int64),
                    "step": np.zeros(AGENTS, np.int32),
                    "agent": np.array([f"agent_{i}" for i in range(AGENTS)]),
                    "obs": obs,
                    "action": action.astype(np.int64),
                    "reward": (action == coin).astype(np.float32),
                    "next_obs": obs,
                    "terminated": np.ones(AGENTS, bool),
                    "truncated": np.zeros(AGENTS, bool),
                }
            )


PLUGIN = FamilyPlugin(
    evaluate_run=evaluate_run,
    headline=("hit_rate",),
    dataset_evaluator=CoinEvaluator,
    collection=lambda expert, stochastic, seed: CoinCollection(seed),
)
