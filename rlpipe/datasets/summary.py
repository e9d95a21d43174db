"""`rlpipe datasets inspect`: a polars summary of a stored dataset; `rlpipe datasets lineage`'s tree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import polars as pl

from rlpipe.datasets.loader import verified_shard_paths
from rlpipe.datasets.store import METADATA_FILE, DatasetInfo, store_root
from rlpipe.errors import RlpipeError


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
    width = int(np.prod(space.shape))  # type: ignore[arg-type]  # shape is None only for Dict action spaces
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


def lineage_tree(info: DatasetInfo, store: str | os.PathLike | None = None) -> list[str]:
    """`rlpipe datasets lineage`'s lines (`rlpipe.datasets.ops.lineage_lines`). Opening the
    dataset checked its records' types; a `provenance` that leads back to a dataset it came
    from (edited metadata: it is not covered by the data's hashes) is one RlpipeError naming it,
    where the tree would go on until Python's recursion limit."""
    from rlpipe.datasets.ops import lineage_lines

    _refuse_provenance_cycle(info, store_root(store), ())
    try:
        return lineage_lines(info, store)
    except RecursionError:
        raise RlpipeError(f"{info.path / METADATA_FILE}: the lineage of dataset {info.name!r} is nested too deeply to print") from None


def _refuse_provenance_cycle(info: DatasetInfo, root: Path, path: tuple[tuple[str, str], ...]) -> None:
    """Follow the `provenance` records the lineage tree expands through the store (a relabelled
    dataset names its source by name and content hash: `lineage_lines` shows that source's own
    lineage when the store holds it unchanged), raising when one leads to a dataset on `path`."""
    from rlpipe.datasets.store import open_dataset

    def sources(node: dict[str, Any]) -> list[dict[str, Any]]:  # the provenance records the tree expands, as ops does
        if "lineage" in node:
            return [found for parent in node["lineage"]["parents"] for found in sources(parent)]
        return [node["provenance"]] if "provenance" in node else []

    here = path + ((info.name, info.metadata["content_hash"]),)
    for provenance in sources(info.metadata):
        source = (provenance["source_dataset"], provenance["source_content_hash"])
        if source in here:
            raise RlpipeError(
                f"{info.path / METADATA_FILE} 'provenance': the lineage of dataset {here[0][0]!r} loops back to "
                f"dataset {source[0]!r}, which it came from (edited metadata?)"
            )
        try:
            found = open_dataset(source[0], root, check_files=False) if (root / source[0]).is_dir() else None
        except RlpipeError:
            found = None
        if found is not None and found.metadata["content_hash"] == source[1]:
            _refuse_provenance_cycle(found, root, here)
