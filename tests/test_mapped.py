"""Sampling datasets larger than memory: minibatches gathered from memory-mapped shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.commands.collect import collect_dataset
from rlpipe.datasets.loader import load_shards
from rlpipe.datasets.mapped import MappedTransitions
from rlpipe.datasets.store import open_dataset
from rlpipe.datasets.writer import write_rows
from rlpipe.envs.spaces import ActionScaler
from rlpipe.training.sampler import MappedSampler, TransitionSampler


def sharded_copy(store: Path, env_id: str, episodes: int, shard_bytes: int) -> str:
    """A random dataset of `env_id` rewritten in shards of about `shard_bytes` (several shards)."""
    source = collect_dataset(env_id, episodes=episodes, num_envs=4, fmt="arrow", store=store, name="source", progress=False)
    data = load_shards(open_dataset("source", store))
    info = open_dataset("source", store)
    starts = np.r_[data.episode_starts(), len(data)]
    blocks = (
        {
            name: getattr(data, name)[a:b]
            for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode_id", "step")
        }
        for a, b in zip(starts[:-1], starts[1:])
    )
    write_rows(
        "sharded",
        blocks,
        info.observation_space,
        info.action_space,
        env_id=env_id,
        producer=source.metadata["producer"],
        store=store,
        fmt="arrow",
        shard_bytes=shard_bytes,
    )
    return "sharded"


@pytest.mark.parametrize(
    "env_id,resident_bytes", [("CartPole-v1", 1 << 30), ("Pendulum-v1", 1 << 30), ("CartPole-v1", 0), ("Pendulum-v1", 30_000)]
)
def test_mapped_sampler_equals_in_ram_sampler(store: Path, env_id: str, resident_bytes: int) -> None:
    """Same seed, same batches: the gather over several shards (columns mapped, or read with
    pread beyond `resident_bytes`) gives exactly the rows (and converted actions) the in-RAM
    sampler gives, for the same drawn indices."""
    name = sharded_copy(store, env_id, episodes=40, shard_bytes=20_000)
    info = open_dataset(name, store)
    assert len(info.shard_paths) >= 3
    action_map = ActionScaler(info.action_space).from_env
    in_ram = TransitionSampler(load_shards(info), seed=7, action_map=action_map)
    transitions = MappedTransitions(info, resident_bytes=resident_bytes)
    assert bool(transitions.read_columns) == (resident_bytes < 1 << 30)
    assert set(transitions.resident) | set(transitions.read_columns) | {"next_obs"} == {"obs", "action", "reward", "next_obs", "terminated"}
    mapped = MappedSampler(transitions, seed=7, action_map=action_map)
    assert mapped.size == in_ram.size
    for _ in range(10):
        ours, theirs = mapped.sample(256), in_ram.sample(256)
        for field in ("obs", "actions", "rewards", "next_obs", "terminated"):
            assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    every_row = torch.arange(in_ram.size)
    assert torch.equal(mapped.take(every_row).obs, in_ram.take(every_row).obs)
    assert torch.equal(mapped.take(every_row).terminated, in_ram.take(every_row).terminated)


@pytest.mark.parametrize("resident_bytes", [1 << 30, 0])
def test_mapped_column_copies_a_whole_column(store: Path, resident_bytes: int) -> None:
    name = sharded_copy(store, "CartPole-v1", episodes=20, shard_bytes=10_000)
    info = open_dataset(name, store)
    data = load_shards(info)
    mapped = MappedTransitions(info, resident_bytes=resident_bytes)
    np.testing.assert_array_equal(mapped.obs, data.obs)
    np.testing.assert_array_equal(mapped.column("terminated"), data.terminated)
    mapped.close()


def test_next_obs_is_gathered_from_obs_only_where_rows_chain(store: Path) -> None:
    """Collected rows chain (next_obs = the following obs), so next_obs is read from obs except at
    episode ends; the control, a dataset whose next_obs do not follow, keeps its own column."""
    from rlpipe.datasets.mapped import FollowingRows

    info = open_dataset(sharded_copy(store, "Pendulum-v1", episodes=4, shard_bytes=1 << 20), store)
    chained = MappedTransitions(info)
    assert isinstance(chained._following, FollowingRows) and "next_obs" not in chained.read_columns + chained.resident
    data = load_shards(info)
    shuffled = {name: getattr(data, name) for name in ("obs", "action", "reward", "terminated", "truncated", "episode_id", "step")}
    shuffled["next_obs"] = np.random.default_rng(0).permutation(data.next_obs)
    write_rows(
        "unchained",
        [shuffled],
        info.observation_space,
        info.action_space,
        env_id="Pendulum-v1",
        producer={},
        store=store,
        fmt="arrow",
        kind="transitions",
    )  # rows of an episodes dataset must chain
    control = MappedTransitions(open_dataset("unchained", store))
    assert control._following is None and "next_obs" in control.resident
    rows = np.arange(len(data))
    np.testing.assert_array_equal(chained.take(rows)["next_obs"], data.next_obs)
    np.testing.assert_array_equal(control.take(rows)["next_obs"], shuffled["next_obs"])
