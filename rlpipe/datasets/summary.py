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
    """One row per episode: id, length (steps; multi-agent: game steps), return (the team's
    for multi-agent data), and how it ended."""
    multi_agent = info.metadata.get("multi_agent", False)
    return (
        scan_steps(info)
        .group_by("episode_id", maintain_order=True)
        .agg(
            (pl.col("step").n_unique() if multi_agent else pl.len()).alias("length"),
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


def agent_table(info: DatasetInfo) -> pl.DataFrame:
    """Multi-agent datasets: each agent's episode returns (mean, std, min, max) and its rows."""
    per_episode = (
        scan_steps(info)
        .group_by("episode_id", "agent")
        .agg(pl.len().alias("rows"), pl.col("reward").cast(pl.Float64).sum().alias("return"))
    )
    return (
        per_episode.group_by("agent")
        .agg(
            pl.len().alias("episodes"),
            pl.col("rows").sum().alias("steps"),
            pl.col("return").mean().alias("return mean"),
            pl.col("return").std().alias("return std"),
            pl.col("return").min().alias("return min"),
            pl.col("return").max().alias("return max"),
        )
        .sort("agent")
        .collect()
    )


def summary_tables(info: DatasetInfo) -> dict[str, pl.DataFrame]:
    """The tables `inspect` prints: totals, return distribution, episode lengths (for
    multi-agent data: team returns and game steps per episode, then each agent's returns and rows), actions."""
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
    if info.metadata.get("multi_agent", False):
        tables["per-agent episode returns"] = agent_table(info)
    return {**tables, "actions": action_table(info)}
