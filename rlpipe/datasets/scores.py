"""Reference scores, D4RL's convention under Minari's names: `ref_min_score` is a uniform
random policy's average return, `ref_max_score` an expert's, so that a return normalises
to 0 (random) .. 1 (expert) and `minari.get_normalized_score` works on our exports."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlpipe.datasets.collector import RandomPolicy, collect

REFERENCE_EPISODES = 100  # Minari's default `num_episodes_average_score`
# D4RL's reference returns (random, expert) of its MuJoCo locomotion datasets, which its
# normalised scores and every published table use: kept for these envs, whatever the version.
D4RL_REFERENCE = {
    "Hopper": (-20.272305, 3234.3),
    "HalfCheetah": (-280.178953, 12135.0),
    "Walker2d": (1.629008, 4592.3),
    "Ant": (-325.6, 3879.7),
}
REFERENCE_SEED = 123  # the reset seed Minari's own reference rollouts use


def random_policy_return(env_id: str, episodes: int = REFERENCE_EPISODES, seed: int = REFERENCE_SEED) -> float:
    """The uniform random policy's mean return over `episodes` episodes (vectorised, seeded)."""
    stats = collect(
        env_id,
        lambda space, num_envs: RandomPolicy(space, num_envs, seed),
        lambda rows: None,
        episodes=episodes,
        num_envs=min(episodes, 16),
        seed=seed,
        show_progress=False,
    )
    return stats.mean_return


def reference_scores(env_id: str, expert_return: float | None) -> dict[str, Any]:
    """Metadata entries for a dataset of `env_id`: D4RL's reference returns for its MuJoCo
    locomotion envs; otherwise `ref_min_score` from a random rollout, and `ref_max_score` when
    an expert's mean return is known (expert rollouts, or the final evaluation of a trained expert)."""
    name = env_id.split("/")[-1].split("-v")[0]
    if name in D4RL_REFERENCE:
        low, high = D4RL_REFERENCE[name]
        return {"ref_min_score": low, "ref_max_score": high, "num_episodes_average_score": REFERENCE_EPISODES}
    scores: dict[str, Any] = {"ref_min_score": random_policy_return(env_id), "num_episodes_average_score": REFERENCE_EPISODES}
    if expert_return is not None:
        scores["ref_max_score"] = float(expert_return)
    return scores


def normalized_score(metadata: dict[str, Any], returns: float | np.ndarray) -> float | np.ndarray | None:
    """(return - ref_min_score) / (ref_max_score - ref_min_score), or None without both scores."""
    low, high = metadata.get("ref_min_score"), metadata.get("ref_max_score")
    if low is None or high is None or high == low:
        return None
    return (np.asarray(returns, dtype=np.float64) - low) / (high - low)
