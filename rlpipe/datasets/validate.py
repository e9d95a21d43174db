"""Re-checking a stored dataset: files, sizes, content hash, Arrow schema, row counts and
the row invariant of its kind (docs/dataset-format.md)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rlpipe.datasets.loader import info_space_of
from rlpipe.datasets.schema import step_schema
from rlpipe.datasets.store import DatasetInfo, hash_files, layout_problems
from rlpipe.envs import trusted_env_id, trusted_env_spec
from rlpipe.errors import RlpipeError


def validate_dataset(info: DatasetInfo) -> list[str]:
    """Return a list of problems (empty when the dataset is intact)."""
    problems = []
    recorded = info.metadata["files"]
    missing = [rel for rel in recorded if not (info.path / rel).is_file()]
    problems += [f"missing file {rel}" for rel in missing]
    problems += [problem for problem in layout_problems(info) if problem.startswith("stray file")]
    present = [rel for rel in recorded if rel not in missing]
    actual, content_hash = hash_files(info.path, present)
    for rel, facts in actual.items():
        if facts != recorded[rel]:
            problems.append(f"{rel} does not match its recorded size/sha256 (modified or truncated)")
    if not missing and content_hash != info.metadata["content_hash"]:
        problems.append("content hash differs from metadata")
    multi_agent = info.metadata.get("multi_agent", False)
    expected = step_schema(info.observation_space, info.action_space, multi_agent, info_space_of(info))
    rows = 0
    kind = info.metadata.get("kind", "episodes")
    if kind not in ("episodes", "transitions"):
        problems.append(f"unknown dataset kind {kind!r}")
    last_episode = -1
    for path in info.shard_paths:
        if not path.is_file():
            continue
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
            rows += table.num_rows
            if not table.schema.equals(expected):
                problems.append(f"{path.name}: schema differs from the one the spaces imply")
                continue
            flags = {name: table.column(name).to_numpy() for name in ("episode_id", "step", "terminated", "truncated")}
            if multi_agent:
                found = multi_agent_row_problems(last_episode, agent=table.column("agent").to_numpy(zero_copy_only=False), **flags)
            else:
                found = row_order_problems(kind, last_episode, **flags)
            problems += [f"{path.name}: {problem}" for problem in found]
            last_episode = int(flags["episode_id"][-1]) if table.num_rows else last_episode
        except (pa.ArrowInvalid, OSError) as exc:
            problems.append(f"{path.name}: unreadable Arrow IPC file ({exc})")
    if not missing and rows != info.metadata["total_steps"]:
        problems.append(f"shards hold {rows} rows, metadata says {info.metadata['total_steps']}")
    return problems


def row_order_problems(
    kind: str, last_episode: int, episode_id: np.ndarray, step: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
) -> list[str]:
    """Where one shard's rows break their kind's invariant (`last_episode`: the previous
    shard's last episode id, -1 for the first shard).

    Both kinds: rows sorted by episode_id. "episodes" also: ids last_episode+1, +2, ... with
    no gaps and no episode split across shards, `step` 0..length-1 within each episode, and
    `terminated` or `truncated` (or both) on each episode's last row and on no other row.
    """
    if len(episode_id) == 0:
        return []
    problems = []
    if episode_id[0] < last_episode or np.any(np.diff(episode_id) < 0):
        problems.append("rows are not sorted by episode_id")
    if kind != "episodes" or problems:
        return problems
    starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
    if not np.array_equal(episode_id[starts], last_episode + 1 + np.arange(len(starts))):
        problems.append(f"episode ids do not run {last_episode + 1}, {last_episode + 2}, ... without gaps (an episode split or missing)")
    lengths = np.diff(np.r_[starts, len(episode_id)])
    if not np.array_equal(step, np.arange(len(step)) - np.repeat(starts, lengths)):
        problems.append("step does not count 0, 1, ... within every episode")
    done = terminated | truncated
    last = np.zeros(len(done), bool)
    last[np.r_[starts[1:], len(done)] - 1] = True
    if np.any(done & ~last):
        row = int(np.flatnonzero(done & ~last)[0])
        problems.append(f"episode {int(episode_id[row])} is terminated or truncated before its last row (step {int(step[row])})")
    if np.any(last & ~done):
        row = int(np.flatnonzero(last & ~done)[0])
        problems.append(f"episode {int(episode_id[row])} ends with neither terminated nor truncated")
    return problems


def multi_agent_row_problems(
    last_episode: int, episode_id: np.ndarray, step: np.ndarray, agent: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
) -> list[str]:
    """Where one shard of a multi-agent dataset (one row per living agent per step, rows of an
    episode sorted by (step, agent), the game's terminated/truncated on every row) breaks
    its invariant: episode ids as for single-agent episodes, each agent's steps 0, 1, ...
    until it dies or the game ends, and done flags on exactly the rows of the last step."""
    if len(episode_id) == 0:
        return []
    if episode_id[0] < last_episode or np.any(np.diff(episode_id) < 0):
        return ["rows are not sorted by episode_id"]
    problems = []
    starts = np.flatnonzero(np.r_[True, episode_id[1:] != episode_id[:-1]])
    if not np.array_equal(episode_id[starts], last_episode + 1 + np.arange(len(starts))):
        problems.append(f"episode ids do not run {last_episode + 1}, {last_episode + 2}, ... without gaps (an episode split or missing)")
    same_episode = episode_id[1:] == episode_id[:-1]
    if np.any(same_episode & (np.diff(step) < 0)):
        problems.append("rows of an episode are not sorted by step")
    for name in np.unique(agent):  # a handful of agents: one vectorised check each
        mine = agent == name
        ids, steps = episode_id[mine], step[mine]
        first = np.r_[True, ids[1:] != ids[:-1]]
        if np.any(steps[first] != 0) or np.any(~first[1:] & (np.diff(steps) != 1)):
            problems.append(f"agent {name}'s steps do not count 0, 1, ... within every episode")
    lengths = np.diff(np.r_[starts, len(episode_id)])
    last_step = np.repeat(step[np.r_[starts[1:], len(step)] - 1], lengths)
    done = terminated | truncated
    if np.any(done != (step == last_step)):
        problems.append("terminated/truncated are not set on exactly the rows of each episode's last step")
    return problems


def require_valid(info: DatasetInfo) -> None:
    """Raise a one-line error naming the first problem, if any."""
    problems = validate_dataset(info)
    if problems:
        raise RlpipeError(f"dataset {info.name!r} is corrupted: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))


def require_trusted_env(info: DatasetInfo) -> None:
    """Raise a one-line error when building the env the dataset records (its env spec,
    Minari's eval env spec or a `module:Env-v0` id) would run code not registered here,
    unless env specs are trusted (`rlpipe.envs.trusted_env_spec`). Nothing is imported."""
    for key in ("env_spec", "eval_env_spec"):
        if info.metadata.get(key):
            trusted_env_spec(info.metadata[key], f"dataset {info.name!r} ({key})")
    if info.env_id:
        trusted_env_id(info.env_id, f"dataset {info.name!r}")
