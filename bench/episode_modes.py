"""How much a discount factor separates a dataset's short episodes from its long ones.

Splits the episodes of an offline dataset by length and prints, for each group, the mean
reward early in the episode and the mean discounted return from the first step at each
gamma. When the short episodes (those that end by falling) earn as much early on as the long
ones, a critic at gamma 0.99 values their first states about equally, and a policy learned
from it may take the early-falling behaviour (docs/d4rl.md).

    .venv/bin/python bench/episode_modes.py hopper-medium --store suites/d4rl-cpu/datasets \
        --out bench/results/episode-modes-hopper-medium.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (sets thread limits before numpy/torch are imported)
import numpy as np
from _common import machine_description, today

from rlpipe.datasets.loader import load_dataset


def discounted_starts(episode: np.ndarray, step: np.ndarray, reward: np.ndarray, gamma: float, n_episodes: int) -> np.ndarray:
    """Each episode's discounted return from its first step: sum over t of gamma^t r_t."""
    totals = np.zeros(n_episodes)
    np.add.at(totals, episode, reward * gamma ** step.astype(np.float64))
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--store", default="datasets")
    parser.add_argument("--short-below", type=int, default=250, help="episodes shorter than this are 'short'")
    parser.add_argument("--long-from", type=int, default=500, help="episodes at least this long are 'long'")
    parser.add_argument("--early-steps", type=int, default=150, help="the 'early' part of an episode")
    parser.add_argument("--gammas", default="0.99,0.995,0.999")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    data = load_dataset(args.dataset, args.store)
    episode = np.unique(np.asarray(data.episode_id), return_inverse=True)[1]
    step, reward = np.asarray(data.step), np.asarray(data.reward, np.float64)
    lengths = np.bincount(episode)
    gammas = [float(g) for g in args.gammas.split(",")]
    starts = {g: discounted_starts(episode, step, reward, g, lengths.size) for g in gammas}
    groups = {"short": lengths < args.short_below, "long": lengths >= args.long_from, "all": lengths > 0}
    result: dict[str, Any] = {
        "dataset": args.dataset,
        "episodes": int(lengths.size),
        "length_percentiles": {str(p): float(np.percentile(lengths, p)) for p in (5, 10, 25, 50, 75, 90)},
        "groups": {},
        "machine": machine_description(),
        "date": today(),
    }
    for name, chosen in groups.items():
        if not chosen.any():
            print(f"{name:>5}: no episodes")
            continue
        rows = chosen[episode]
        result["groups"][name] = {
            "episodes": int(chosen.sum()),
            "early_reward_mean": float(reward[rows & (step < args.early_steps)].mean()),
            "discounted_return_from_start": {str(g): float(starts[g][chosen].mean()) for g in gammas},
        }
        line = ", ".join(f"gamma {g}: {starts[g][chosen].mean():.1f}" for g in gammas)
        print(f"{name:>5} ({chosen.sum()} episodes): early reward {result['groups'][name]['early_reward_mean']:.3f}; {line}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
