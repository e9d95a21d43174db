"""`rlpipe datasets inspect`: a polars summary of a stored dataset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import polars as pl

from rlpipe.datasets.loader import verified_shard_paths
from rlpipe.datasets.store import DatasetInfo


def scan_steps(info: DatasetInfo) -> pl.LazyFrame:
    """The step table as a polars LazyFrame over the dataset's shards, after checking their
    hashes and schemas (polars would crash or count stray files otherwise)."""
    return pl.scan_ipc([str(path) for path in verified_shard_paths(info)])


def episode_table(info: DatasetInfo) -> pl.DataFrame:
    """One row per episode: id, length, return, and how it ended."""
    return (
        scan_steps(info)
        .group_by("episode_id", maintain_order=True)
        .agg(
            pl.len().alias("length"),
            pl.col("reward").cast(pl.Float64).sum().alias("return"),
            pl.col("terminated").last().alias("terminated"),
            pl.col("truncated").last().alias("truncated"),
        )
        .collect()
    )


def action_table(info: DatasetInfo) -> pl.DataFrame:
    """Action statistics: counts per action for discrete spaces, per-dimension moments for Box."""
    steps = scan_steps(info)
    space = info.action_space
    if isinstance(space, gym.spaces.Discrete):
        return steps.group_by("action").agg(pl.len().alias("count")).sort("action").collect()
    width = int(np.prod(space.shape))
    return steps.select([pl.col("action").arr.get(i).alias(f"action[{i}]") for i in range(width)]).collect().describe()


def summary_tables(info: DatasetInfo) -> dict[str, pl.DataFrame]:
    """The tables `inspect` prints: totals, return distribution, episode lengths, actions."""
    episodes = episode_table(info)
    totals = pl.DataFrame(
        {
            "episodes": [episodes.height],
            "steps": [int(episodes["length"].sum())],
            "terminated": [int(episodes["terminated"].sum())],
            "truncated": [int(episodes["truncated"].sum())],
        }
    )
    tables = {"totals": totals}
    if info.metadata.get("kind", "episodes") == "episodes":  # rows of a transition dataset are not trajectories
        tables["episode returns and lengths"] = episodes.select("return", "length").describe()
    return {**tables, "actions": action_table(info)}
