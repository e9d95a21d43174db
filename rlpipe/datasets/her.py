"""Hindsight experience replay (HER) relabelling, vectorised over a whole step table.

`goal_rows` is the one piece shared with online HER replay buffers: given transition rows
and their episode bounds it picks, per strategy, the row whose achieved goal becomes the
new desired goal. `relabel_dataset` uses it to write a new dataset holding the original
transitions plus k relabelled copies of each, with rewards and `terminated` recomputed by
the env's own `compute_reward` / `compute_terminated`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlpipe.datasets.hdf5 import MINARI_METADATA_KEYS
from rlpipe.datasets.loader import TransitionArrays, load_shards
from rlpipe.datasets.schema import Columnar, map_columnar
from rlpipe.datasets.store import METADATA_FILE, DatasetInfo, check_name
from rlpipe.datasets.writer import write_rows
from rlpipe.envs import recorded_env_id
from rlpipe.envs.goals import GOAL_KEYS
from rlpipe.errors import RlpipeError
from rlpipe.limits import check_seed

STRATEGIES = ("future", "final", "episode", "random")
# Relabelled rows built at once: about 100 MB of arrays for GoalWorld's rows, whatever k.
ROWS_PER_CHUNK = 1 << 20
# Rows a relabelling may write (k copies of each transition): beyond this, k is a typo
# (2**32 GoalWorld rows take about 300 GB), and episode ids stay far inside int64.
MAX_RELABELLED_ROWS = 2**32


def goal_rows(
    strategy: str,
    rows: np.ndarray,
    episode_start: np.ndarray,
    episode_end: np.ndarray,
    rng: np.random.Generator,
    num_rows: int,
) -> np.ndarray:
    """Rows whose `next_obs.achieved_goal` becomes the relabelled goal of each row in `rows`.

    `episode_start[i]` / `episode_end[i]` are the first / last row of the episode holding
    `rows[i]`. future: a uniform row from `rows[i]` to the episode's end (goals the agent
    reached at this step or later); final: the episode's last row; episode: any row of the
    episode; random: any row of the whole table (`num_rows` rows).
    """
    if strategy == "future":
        return rows + (rng.random(len(rows)) * (episode_end - rows + 1)).astype(np.int64)
    if strategy == "final":
        return episode_end.copy()
    if strategy == "episode":
        return episode_start + (rng.random(len(rows)) * (episode_end - episode_start + 1)).astype(np.int64)
    if strategy == "random":
        return rng.integers(num_rows, size=len(rows))
    raise RlpipeError(f"unknown HER strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")


def check_goal_space(space: gym.Space, name: str) -> None:
    """Raise unless `space` is a Dict with observation, achieved_goal and desired_goal."""
    if not isinstance(space, gym.spaces.Dict) or not set(GOAL_KEYS) <= set(space.spaces):
        raise RlpipeError(
            f"dataset {name!r} has no goal-conditioned observations (needs a Dict with {', '.join(GOAL_KEYS)}); HER cannot relabel it"
        )


def goal_functions(env_id: str | None) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """The env's vectorised `compute_reward` and `compute_terminated` (never terminated if absent)."""
    try:
        env = gym.make(env_id).unwrapped  # type: ignore[arg-type]  # None raises the TypeError reported below
    except (gym.error.Error, TypeError) as exc:
        raise RlpipeError(f"cannot rebuild env {env_id!r} to recompute rewards: {exc}") from None
    if not hasattr(env, "compute_reward"):
        raise RlpipeError(f"env {env_id!r} has no compute_reward(achieved_goal, desired_goal, info); HER needs it")

    env_terminated = getattr(env, "compute_terminated", None)

    def compute_terminated(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        # One flag per row: the robotics envs' compute_terminated returns a single False for any batch.
        value = False if env_terminated is None else env_terminated(achieved, desired, info)
        return np.broadcast_to(np.asarray(value, dtype=bool), achieved.shape[:-1])

    return env.compute_reward, compute_terminated


def _relabelled_rows(
    data: TransitionArrays,
    episode_bounds: np.ndarray,
    blocks: range,
    copies: int,
    strategy: str,
    rng: np.random.Generator,
    compute_reward: Callable[..., np.ndarray],
    compute_terminated: Callable[..., np.ndarray],
) -> dict[str, Columnar]:
    """The relabelled copies numbered `blocks`, each copy an episode of its own: block
    e*copies + j is copy j of episode e, with id E + e*copies + j (E episodes in `data`).

    `episode_bounds` holds every episode's first row and, last, the row count.
    """
    block = np.arange(blocks.start, blocks.stop)
    episode = block // copies
    starts = episode_bounds[episode]
    lengths = episode_bounds[episode + 1] - starts
    # Output order: episode, copy, step — so each (episode, copy) is a contiguous episode.
    block_of_row = np.repeat(np.arange(len(block)), lengths)
    rows = starts[block_of_row] + np.arange(len(block_of_row)) - np.repeat(np.cumsum(np.r_[0, lengths])[:-1], lengths)
    targets = goal_rows(strategy, rows, starts[block_of_row], starts[block_of_row] + lengths[block_of_row] - 1, rng, len(data))
    # goal datasets hold Dict observations (check_goal_space)
    obs, next_obs = cast("dict[str, np.ndarray]", data.obs), cast("dict[str, np.ndarray]", data.next_obs)
    goal = next_obs["achieved_goal"][targets]
    achieved = next_obs["achieved_goal"][rows]
    terminated = compute_terminated(achieved, goal, None).astype(bool)

    def with_goal(obs: dict[str, np.ndarray]) -> dict[str, Columnar]:
        out: dict[str, Columnar] = {key: values[rows] for key, values in obs.items()}
        out["desired_goal"] = goal
        return out

    return {
        "episode_id": len(episode_bounds) - 1 + block[block_of_row],
        "step": data.step[rows],
        "obs": with_goal(obs),
        "action": map_columnar(data.action, lambda a: a[rows]),
        "reward": np.asarray(compute_reward(achieved, goal, None), dtype=np.float32),
        "next_obs": with_goal(next_obs),
        "terminated": terminated,
        "truncated": data.truncated[rows] & ~terminated,
    }


def _block_chunks(lengths: np.ndarray, copies: int, max_rows: int) -> Iterator[range]:
    """Consecutive ranges of blocks (block e*copies + j: copy j of episode e, `lengths[e]`
    rows) that together cover every block, each of at most `max_rows` rows: whole episodes
    with all their copies where they fit, else one episode's copies split into groups (a
    single copy longer than `max_rows` is a chunk of its own)."""
    ends = np.cumsum(lengths * copies)
    episode = 0
    while episode < len(lengths):
        done = int(ends[episode - 1]) if episode else 0
        last = int(np.searchsorted(ends, done + max_rows, side="right"))  # episodes [episode, last) fit whole
        if last > episode:
            yield range(episode * copies, last * copies)
            episode = last
            continue
        per_chunk = max(1, max_rows // int(lengths[episode]))
        for j in range(0, copies, per_chunk):
            yield range(episode * copies + j, episode * copies + min(j + per_chunk, copies))
        episode += 1


def _check_output_size(rows: int, copies: int) -> None:
    """Refuse a k whose output would exceed MAX_RELABELLED_ROWS, before anything is written."""
    if rows * copies > MAX_RELABELLED_ROWS:
        raise RlpipeError(
            f"--k {copies} would write {rows * copies} relabelled rows; at most {MAX_RELABELLED_ROWS} "
            f"(2**32) are written, so k <= {MAX_RELABELLED_ROWS // max(rows, 1)} for this dataset of {rows} transitions"
        )


def relabel_dataset(
    info: DatasetInfo,
    name: str,
    *,
    strategy: str = "future",
    k: int = 4,
    seed: int = 0,
    store: str | os.PathLike | None = None,
    force: bool = False,
    rows_per_chunk: int = ROWS_PER_CHUNK,
) -> Path:
    """Write dataset `name`: the transitions of `info` (episode ids 0..E-1) followed by k
    relabelled copies of every transition (episode id E + e*k + j for copy j of episode e).

    The copies are transition tables, not replayable trajectories (a copy may terminate
    mid-episode and end with neither flag, each row may carry its own goal), so the result
    is a dataset of kind "transitions": Arrow-only, no episode statistics. Rewards come from
    the env the source's spec describes (`rlpipe.envs.recorded_env_id`: unregistered code
    needs trust); the result keeps that spec and Minari's metadata. Beyond the source's
    arrays, memory is bounded by `rows_per_chunk` rows (or one episode, if longer) whatever
    `k`; a `k` whose output would exceed MAX_RELABELLED_ROWS rows is refused.
    """
    if strategy not in STRATEGIES:
        raise RlpipeError(f"unknown HER strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if k < 1:
        raise RlpipeError(f"--k must be at least 1, got {k}")
    check_name(name)  # before any work
    check_seed(seed, "--seed")
    copies = 1 if strategy == "final" else k
    check_goal_space(info.observation_space, info.name)
    where = f"{info.path / METADATA_FILE} 'env_spec'"
    env_id = recorded_env_id(info.env_id, info.metadata.get("env_spec"), f"dataset {info.name!r}", where) if info.env_id else None
    compute_reward, compute_terminated = goal_functions(env_id)
    data = load_shards(info)
    _check_output_size(len(data), copies)
    rng = np.random.default_rng(seed)

    bounds = np.r_[data.episode_starts(), len(data)]
    num_episodes = len(bounds) - 1
    lengths = np.diff(bounds)

    def batches() -> Iterator[dict[str, Columnar]]:
        for chunk in _block_chunks(lengths, 1, rows_per_chunk):
            rows = slice(int(bounds[chunk.start]), int(bounds[chunk.stop]))
            yield {
                "episode_id": data.episode_id[rows],
                "step": data.step[rows],
                "obs": map_columnar(data.obs, lambda a: a[rows]),
                "action": map_columnar(data.action, lambda a: a[rows]),
                "reward": data.reward[rows],
                "next_obs": map_columnar(data.next_obs, lambda a: a[rows]),
                "terminated": data.terminated[rows],
                "truncated": data.truncated[rows],
            }
        for chunk in _block_chunks(lengths, copies, rows_per_chunk):
            yield _relabelled_rows(data, bounds, chunk, copies, strategy, rng, compute_reward, compute_terminated)

    provenance = {
        "transform": "her",
        "source_dataset": info.name,
        "source_content_hash": info.metadata["content_hash"],
        "strategy": strategy,
        "k": copies,
        "seed": seed,
        "original_episodes": num_episodes,
    }
    return write_rows(
        name,
        batches(),
        info.observation_space,
        info.action_space,
        env_id=info.env_id,
        env_spec=info.metadata.get("env_spec"),
        kind="transitions",
        producer={**info.metadata["producer"], "relabelled_by": "her"},
        extra={"provenance": provenance, **{key: info.metadata[key] for key in MINARI_METADATA_KEYS if key in info.metadata}},
        store=store,
        fmt="arrow",
        force=force,
    )
